package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/agentenv/agentenv/cluster/nodeagent"
)

func TestAdvertiseAddr(t *testing.T) {
	if got := advertiseAddr("10.1.2.3:3000", "aenv"); got != "10.1.2.3:3000" {
		t.Fatalf("a specific listen address: %q", got)
	}
	got := advertiseAddr("0.0.0.0:3000", "aenv")
	host, port, err := net.SplitHostPort(got)
	if err != nil || port != "3000" {
		t.Fatalf("advertise of 0.0.0.0:3000: %q (%v)", got, err)
	}
	ip := net.ParseIP(host)
	if ip == nil || ip.IsLoopback() || (ip.IsUnspecified() && hasIPv4(t)) {
		t.Fatalf("advertise of 0.0.0.0:3000: %q, want the host's first IPv4 address", got)
	}
}

// hasIPv4 reports whether some interface but loopback has an IPv4 address.
func hasIPv4(t *testing.T) bool {
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, ifc := range ifs {
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && ifc.Flags&net.FlagUp != 0 {
				return true
			}
		}
	}
	return false
}

// TestHoldUntilOpen: a starting cluster node holds every request but the
// passed paths until its gate opens, and a client that gives up meanwhile
// gets nothing from the handler.
func TestHoldUntilOpen(t *testing.T) {
	open := make(chan struct{})
	served := make(chan string, 4)
	h := holdUntil(open, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served <- r.URL.Path
	}), "/health")
	srv := httptest.NewServer(h)
	defer srv.Close()

	if resp, err := http.Get(srv.URL + "/health"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/health while held: %v %v", resp, err)
	}
	if got := <-served; got != "/health" {
		t.Fatalf("served %q, want /health", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/sandboxes/gone", nil)
	if _, err := http.DefaultClient.Do(req); err == nil {
		t.Fatal("a sandbox request was answered while the gate was closed")
	}
	held := make(chan error, 1)
	go func() {
		resp, err := http.Get(srv.URL + "/sandboxes/x")
		if err == nil {
			resp.Body.Close()
		}
		held <- err
	}()
	select {
	case err := <-held:
		t.Fatalf("answered before the gate opened (%v)", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(open)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	if got := <-served; got != "/sandboxes/x" {
		t.Fatalf("served %q after the gate opened, want /sandboxes/x", got)
	}
	select {
	case got := <-served:
		t.Fatalf("the request whose client gave up was served: %q", got)
	default:
	}
}

// TestGateOpensWithoutScheduler: a node whose scheduler never answers
// serves after the bounded wait (and says so), instead of never.
func TestGateOpensWithoutScheduler(t *testing.T) {
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := dead.Addr().String()
	dead.Close()
	m := &clusterMember{open: make(chan struct{}), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if m.agent, err = nodeagent.New(nodeagent.Options{Schedulers: []string{addr}, Name: "n", APIURL: "http://127.0.0.1:1", Source: noSource{}}); err != nil {
		t.Fatal(err)
	}
	defer m.agent.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = m.agent.Run(ctx) }()
	go m.openWhenReady(ctx, 200*time.Millisecond)
	select {
	case <-m.open:
	case <-time.After(10 * time.Second):
		t.Fatal("the gate stays closed without a scheduler")
	}
	select {
	case <-m.agent.Ready():
		t.Fatal("the agent says ready without any scheduler answer")
	default:
	}
	var nilMember *clusterMember
	if h := http.NotFoundHandler(); nilMember.gate(h) == nil {
		t.Fatal("a node outside a cluster has no handler")
	}
}

type noSource struct{}

func (noSource) Usage() nodeagent.Usage                           { return nodeagent.Usage{} }
func (noSource) DropCopy(context.Context, string) (string, error) { return "", nil }

// TestFencedAnswers: a request on a sandbox the node proves it owns is
// served; one bound elsewhere is answered as not here (404 on the API, the
// proxy's 502), one unproven 503 with Retry-After; requests naming no
// sandbox pass untouched.
func TestFencedAnswers(t *testing.T) {
	vouch := func(_ context.Context, id string) error {
		switch id {
		case "moved":
			return nodeagent.ErrMoved
		case "cut":
			return nodeagent.ErrUnproven
		}
		return nil
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) })
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	byHeader := func(r *http.Request) (string, bool) { id := r.Header.Get("E2b-Sandbox-Id"); return id, id != "" }
	api := httptest.NewServer(fenced(ok, apiSandboxOf(headerRoute{}), vouch, false, log))
	defer api.Close()
	px := httptest.NewServer(fenced(ok, byHeader, vouch, true, log))
	defer px.Close()
	for _, c := range []struct {
		srv, path, id string
		want          int
	}{
		{api.URL, "/sandboxes/mine", "", http.StatusTeapot},
		{api.URL, "/v2/sandboxes/moved/connect", "", http.StatusNotFound},
		{api.URL, "/sandboxes/cut/pause", "", http.StatusServiceUnavailable},
		{api.URL, "/sandboxes", "", http.StatusTeapot},
		{api.URL, "/health", "cut", http.StatusServiceUnavailable}, // proxied on the API port
		{px.URL, "/files", "moved", http.StatusBadGateway},
		{px.URL, "/files", "cut", http.StatusServiceUnavailable},
		{px.URL, "/files", "mine", http.StatusTeapot},
	} {
		req, _ := http.NewRequest("GET", c.srv+c.path, nil)
		if c.id != "" {
			req.Header.Set("E2b-Sandbox-Id", c.id)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want || (c.want == http.StatusServiceUnavailable) != (resp.Header.Get("Retry-After") != "") {
			t.Fatalf("%s (sandbox header %q): %d Retry-After %q, want %d", c.path, c.id, resp.StatusCode,
				resp.Header.Get("Retry-After"), c.want)
		}
	}
}

// headerRoute names the sandbox of the E2B routing header (the proxy's
// SandboxOf, by header only).
type headerRoute struct{}

func (headerRoute) SandboxOf(r *http.Request) (string, bool) {
	id := r.Header.Get("E2b-Sandbox-Id")
	return id, id != ""
}
