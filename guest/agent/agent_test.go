package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/agentenv/agentenv/guest/agent"
	"github.com/agentenv/agentenv/guest/agent/agentclient"
	"github.com/agentenv/agentenv/guest/agent/agenttest"
	fspb "github.com/agentenv/agentenv/guest/agent/gen/filesystem"
	"github.com/agentenv/agentenv/guest/agent/gen/filesystem/filesystemconnect"
	pb "github.com/agentenv/agentenv/guest/agent/gen/process"
	"github.com/agentenv/agentenv/guest/agent/gen/process/processconnect"
	"github.com/agentenv/agentenv/guest/agent/state"
)

func request(t *testing.T, method, url, body string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := agenttest.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestHealth(t *testing.T) {
	t.Parallel()
	srv := agenttest.Start(t)
	resp, _ := request(t, "GET", srv.URL+"/health", "")
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

func TestInitTokenAndEnvs(t *testing.T) {
	t.Parallel()
	srv := agenttest.Start(t)
	fs := filesystemconnect.NewFilesystemClient(agenttest.Client, srv.URL, connect.WithProtoJSON())
	stat := func(hdr ...string) error {
		req := connect.NewRequest(&fspb.StatRequest{Path: "/"})
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header().Set(hdr[i], hdr[i+1])
		}
		_, err := fs.Stat(ctxT(t), req)
		return err
	}
	if err := stat(); err != nil {
		t.Fatalf("before /init no token is needed: %v", err)
	}

	body := `{"accessToken":"tok1","envVars":{"A":"1","B":"two"},"timestamp":"2020-01-01T00:00:00Z","defaultWorkdir":"/tmp"}`
	resp, b := request(t, "POST", srv.URL+"/init", body, "Content-Type", "application/json")
	if resp.StatusCode != http.StatusNoContent || resp.Header.Get("X-Envd-Version") != agent.Version {
		t.Fatalf("init: %d %v %s", resp.StatusCode, resp.Header, b)
	}
	if time.Now().Year() < 2025 {
		t.Fatal("/init with SkipInitDuties changed the clock")
	}

	if err := stat(); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("RPC without token: %v, want unauthenticated", err)
	}
	if err := stat("X-Access-Token", "wrong"); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("RPC with a wrong token: %v, want unauthenticated", err)
	}
	if err := stat("X-Access-Token", "tok1"); err != nil {
		t.Fatalf("RPC with the token: %v", err)
	}
	for _, path := range []string{"/envs", "/metrics"} {
		if resp, _ := request(t, "GET", srv.URL+path, ""); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%s without token: %d", path, resp.StatusCode)
		}
	}
	if resp, _ := request(t, "GET", srv.URL+"/health", ""); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("/health must stay open: %d", resp.StatusCode)
	}

	resp, b = request(t, "GET", srv.URL+"/envs", "", "X-Access-Token", "tok1")
	var envs map[string]string
	if err := json.Unmarshal(b, &envs); err != nil || envs["A"] != "1" || envs["B"] != "two" {
		t.Fatalf("/envs: %d %s", resp.StatusCode, b)
	}

	// Processes see the variables and start in the default workdir.
	out, _, code, err := agentclient.RunWith(ctxT(t), srv.URL, nil, []agentclient.Option{agentclient.WithToken("tok1")}, "/bin/sh", "-c", `echo "$A-$B"; pwd`)
	if err != nil || code != 0 || string(out) != "1-two\n/tmp\n" {
		t.Fatalf("process after init: %q %d %v", out, code, err)
	}

	// Re-init (after resume) must prove it knows the token.
	if resp, _ := request(t, "POST", srv.URL+"/init", `{"accessToken":"stolen"}`); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("re-init without token: %d", resp.StatusCode)
	}
	if resp, _ := request(t, "POST", srv.URL+"/init", `{"accessToken":"tok2","envVars":{"C":"3"}}`, "X-Access-Token", "tok1"); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("re-init with token: %d", resp.StatusCode)
	}
	if err := stat("X-Access-Token", "tok2"); err != nil {
		t.Fatalf("new token refused: %v", err)
	}
	_, b = request(t, "GET", srv.URL+"/envs", "", "X-Access-Token", "tok2")
	if err := json.Unmarshal(b, &envs); err != nil || envs["A"] != "1" || envs["C"] != "3" {
		t.Fatalf("envs after re-init: %s", b)
	}
}

func TestInitBadBodies(t *testing.T) {
	t.Parallel()
	srv := agenttest.Start(t)
	for name, body := range map[string]string{
		"not json":       `{"accessToken":`,
		"wrong types":    `{"envVars":["a"]}`,
		"bad timestamp":  `{"timestamp":"yesterday"}`,
		"huge":           `{"envVars":{"x":"` + strings.Repeat("a", 2<<20) + `"}}`,
		"array not obj":  `[1,2,3]`,
		"trailing bytes": `"str"`,
	} {
		t.Run(name, func(t *testing.T) {
			resp, b := request(t, "POST", srv.URL+"/init", body)
			if resp.StatusCode != http.StatusBadRequest {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			var e struct{ Code int }
			if json.Unmarshal(b, &e) != nil || e.Code != 400 {
				t.Fatalf("error body %q", b)
			}
		})
	}
	// An empty body is a valid no-op init (the SDK's debug mode never calls it, orchestrators may).
	if resp, _ := request(t, "POST", srv.URL+"/init", ""); resp.StatusCode != http.StatusNoContent {
		t.Fatalf("empty init: %d", resp.StatusCode)
	}
}

func TestInitDefaultUser(t *testing.T) {
	t.Parallel()
	srv := agenttest.Start(t)
	resp, _ := request(t, "POST", srv.URL+"/init", `{"defaultUser":"root"}`)
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("init: %d", resp.StatusCode)
	}
	out, _, _, err := agentclient.Run(ctxT(t), srv.URL, nil, "/bin/sh", "-c", "echo $USER")
	if err != nil || string(out) != "root\n" {
		t.Fatalf("default user after init: %q %v", out, err)
	}
	resp, _ = request(t, "POST", srv.URL+"/init", `{"defaultUser":"no-such-user-aenv"}`)
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("init: %d", resp.StatusCode)
	}
	if _, _, _, err := agentclient.Run(ctxT(t), srv.URL, nil, "true"); err == nil {
		t.Fatal("a process ran as an unknown default user")
	}
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	srv := agenttest.Start(t)
	resp, b := request(t, "GET", srv.URL+"/metrics", "")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	var m agent.Metrics
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		t.Fatal(err)
	}
	if m.CPUCount < 1 || m.MemTotal == 0 || m.MemUsed == 0 || m.MemUsed > m.MemTotal || m.DiskTotal == 0 || m.DiskUsed > m.DiskTotal ||
		m.CPUUsedPct < 0 || m.CPUUsedPct > 100 || time.Since(time.Unix(m.TS, 0)) > time.Minute {
		t.Fatalf("implausible metrics %+v", m)
	}
}

func TestUnknownRoute(t *testing.T) {
	t.Parallel()
	srv := agenttest.Start(t)
	resp, _ := request(t, "POST", srv.URL+"/process.Process/NoSuchMethod", "{}", "Content-Type", "application/json")
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

func TestRPCBadJSON(t *testing.T) {
	t.Parallel()
	srv := agenttest.Start(t)
	for _, body := range []string{`{"path":`, `{"path": 5}`, `[]`} {
		resp, b := request(t, "POST", srv.URL+"/filesystem.Filesystem/Stat", body, "Content-Type", "application/json")
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "invalid_argument") {
			t.Fatalf("body %q: %d %s", body, resp.StatusCode, b)
		}
	}
}

func TestCORS(t *testing.T) {
	t.Parallel()
	srv := agenttest.Start(t)
	tok := "t"
	srv.Agent.State().Apply(state.Settings{AccessToken: &tok})
	resp, _ := request(t, "OPTIONS", srv.URL+"/process.Process/Start", "",
		"Origin", "https://app.example", "Access-Control-Request-Method", "POST", "Access-Control-Request-Headers", "content-type,x-access-token")
	if resp.StatusCode != http.StatusNoContent || resp.Header.Get("Access-Control-Allow-Origin") != "*" ||
		!strings.Contains(resp.Header.Get("Access-Control-Allow-Headers"), "x-access-token") {
		t.Fatalf("preflight: %d %v", resp.StatusCode, resp.Header)
	}
	resp, _ = request(t, "GET", srv.URL+"/health", "", "Origin", "https://app.example")
	if resp.Header.Get("Access-Control-Allow-Origin") != "*" {
		t.Fatalf("simple request without CORS headers: %v", resp.Header)
	}
	// CORS does not bypass the token.
	resp, _ = request(t, "GET", srv.URL+"/envs", "", "Origin", "https://app.example")
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("/envs from a browser without token: %d", resp.StatusCode)
	}
}

func TestOversizedRPCRefused(t *testing.T) {
	t.Parallel()
	srv := agenttest.Start(t)
	body := `{"path":"` + strings.Repeat("a", agent.MaxRPCMessage+1) + `"}`
	resp, b := request(t, "POST", srv.URL+"/filesystem.Filesystem/Stat", body, "Content-Type", "application/json")
	if resp.StatusCode == http.StatusOK || !strings.Contains(string(b), "resource_exhausted") {
		t.Fatalf("oversized message: %d %.200s", resp.StatusCode, b)
	}
}

// TestTokenOnEveryProtocol: unary and streaming RPCs over Connect, gRPC and
// gRPC-Web all answer unauthenticated without the token, and work with it.
func TestTokenOnEveryProtocol(t *testing.T) {
	t.Parallel()
	srv := agenttest.Start(t)
	tok := "tok"
	srv.Agent.State().Apply(state.Settings{AccessToken: &tok})
	tr := &http.Transport{}
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetUnencryptedHTTP2(true)
	h2c := &http.Client{Transport: tr}
	protocols := map[string][]connect.ClientOption{
		"connect-json": {connect.WithProtoJSON()},
		"grpc":         {connect.WithGRPC()},
		"grpc-web":     {connect.WithGRPCWeb()},
	}
	for name, opts := range protocols {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fs := filesystemconnect.NewFilesystemClient(h2c, srv.URL, opts...)
			pc := processconnect.NewProcessClient(h2c, srv.URL, opts...)
			for _, withToken := range []bool{false, true} {
				statReq := connect.NewRequest(&fspb.StatRequest{Path: "/"})
				startReq := connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "true"}})
				if withToken {
					statReq.Header().Set("X-Access-Token", tok)
					startReq.Header().Set("X-Access-Token", tok)
				}
				_, err := fs.Stat(ctxT(t), statReq)
				s, serr := pc.Start(ctxT(t), startReq)
				if serr == nil {
					for s.Receive() {
					}
					serr = s.Err()
					s.Close()
				}
				if withToken && (err != nil || serr != nil) {
					t.Fatalf("with token: %v / %v", err, serr)
				}
				if !withToken && (connect.CodeOf(err) != connect.CodeUnauthenticated || connect.CodeOf(serr) != connect.CodeUnauthenticated) {
					t.Fatalf("without token: %v / %v, want unauthenticated", err, serr)
				}
			}
		})
	}
}
