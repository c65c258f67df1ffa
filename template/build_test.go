package template_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/aenvdtest"
	"github.com/agentenv/agentenv/guest/agent/agentclient"
	"github.com/agentenv/agentenv/internal/testutil/guestassets"
	"github.com/agentenv/agentenv/internal/testutil/smallroot"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// smallImageLayer is a tiny root filesystem from this host's files
// (package smallroot).
func smallImageLayer(t *testing.T) []byte { return smallroot.Layer(t, nil) }

func pushImage(t *testing.T, host, ref, arch string, layerTar []byte) {
	t.Helper()
	layer, err := tarball.LayerFromReader(bytes.NewReader(layerTar))
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Config.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "FROM_IMAGE=yes"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	r, err := name.ParseReference(host + "/" + ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img, remote.WithPlatform(v1.Platform{OS: "linux", Architecture: arch})); err != nil {
		t.Fatalf("push %s: %v", r, err)
	}
}

// filesArchive is a COPY step's upload: a tar of context-relative paths.
func filesArchive(t *testing.T) ([]byte, string) {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range []struct {
		name, data string
		dir        bool
		mode       int64
	}{
		{"src", "", true, 0o755}, {"src/a.txt", "alpha\n", false, 0o644}, {"src/sub", "", true, 0o755},
		{"src/sub/b.sh", "#!/bin/sh\necho beta\n", false, 0o755}, {"conf.txt", "conf\n", false, 0o644},
	} {
		h := &tar.Header{Name: e.name, Mode: e.mode, Typeflag: tar.TypeReg, Size: int64(len(e.data))}
		if e.dir {
			h.Typeflag, h.Name, h.Size = tar.TypeDir, e.name+"/", 0
		}
		tw.WriteHeader(h)
		tw.Write([]byte(e.data))
	}
	tw.Close()
	sum := sha256.Sum256(b.Bytes())
	return b.Bytes(), hex.EncodeToString(sum[:])
}

type buildClient struct {
	t *testing.T
	n *aenvdtest.Node
}

func (c buildClient) call(method, path, body string, want int) []byte {
	c.t.Helper()
	code, b, _, err := c.n.Call(method, path, c.n.Key, body)
	if err != nil {
		c.t.Fatal(err)
	}
	if code != want {
		c.t.Fatalf("%s %s: %d %s, want %d", method, path, code, b, want)
	}
	return b
}

type buildStatus struct {
	Status     string `json:"status"`
	LogEntries []struct {
		Message string `json:"message"`
		Level   string `json:"level"`
		Step    string `json:"step"`
	} `json:"logEntries"`
	Reason *struct {
		Message string `json:"message"`
		Step    string `json:"step"`
	} `json:"reason"`
}

// build creates a template named name, uploads files, starts the build with
// spec and polls its status (paging through the logs) until it ends.
func (c buildClient) build(name, spec string, files map[string][]byte) (string, string, buildStatus, string) {
	c.t.Helper()
	tid, bid := c.start(name, spec, files)
	st, logs := c.wait(tid, bid, name)
	return tid, bid, st, logs
}

// start creates a template named name, uploads files and starts its build.
func (c buildClient) start(name, spec string, files map[string][]byte) (string, string) {
	c.t.Helper()
	var created struct {
		TemplateID string   `json:"templateID"`
		BuildID    string   `json:"buildID"`
		Names      []string `json:"names"`
		Public     bool     `json:"public"`
	}
	if err := json.Unmarshal(c.call("POST", "/v3/templates", fmt.Sprintf(`{"name":%q,"cpuCount":1,"memoryMB":256}`, name), http.StatusAccepted), &created); err != nil {
		c.t.Fatal(err)
	}
	if created.TemplateID == "" || created.BuildID == "" || len(created.Names) != 1 || created.Names[0] != name || created.Public {
		c.t.Fatalf("create template: %+v", created)
	}
	for hash, data := range files {
		c.upload(created.TemplateID, hash, data)
	}
	c.call("POST", "/v2/templates/"+created.TemplateID+"/builds/"+created.BuildID, spec, http.StatusAccepted)
	return created.TemplateID, created.BuildID
}

func (c buildClient) upload(tid, hash string, data []byte) {
	c.t.Helper()
	var up struct {
		Present bool   `json:"present"`
		URL     string `json:"url"`
	}
	json.Unmarshal(c.call("GET", "/templates/"+tid+"/files/"+hash, "", http.StatusCreated), &up)
	u, err := url.Parse(up.URL)
	if err != nil || up.Present || u.Path != "/templates/"+tid+"/files/"+hash || u.Query().Get("token") == "" {
		c.t.Fatalf("files %s: %+v (%v)", hash, up, err)
	}
	// The URL carries its own upload token: no X-API-Key, as E2B's SDK sends it.
	req, _ := http.NewRequest("PUT", up.URL, bytes.NewReader(data))
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusCreated {
		c.t.Fatalf("upload %s: %v %v", hash, err, resp)
	}
	resp.Body.Close()
	json.Unmarshal(c.call("GET", "/templates/"+tid+"/files/"+hash, "", http.StatusCreated), &up)
	if !up.Present {
		c.t.Fatalf("files %s not present after upload", hash)
	}
}

// wait polls a build's status (paging through the logs) until it ends.
func (c buildClient) wait(tid, bid, name string) (buildStatus, string) {
	c.t.Helper()
	var all []string
	var st buildStatus
	deadline := time.Now().Add(20 * time.Minute)
	for offset := 0; ; {
		path := fmt.Sprintf("/templates/%s/builds/%s/status?logsOffset=%d&limit=100", tid, bid, offset)
		st = buildStatus{}
		if err := json.Unmarshal(c.call("GET", path, "", http.StatusOK), &st); err != nil {
			c.t.Fatal(err)
		}
		for _, l := range st.LogEntries {
			all = append(all, fmt.Sprintf("[%s %s] %s", l.Step, l.Level, l.Message))
		}
		offset += len(st.LogEntries)
		if (st.Status == "ready" || st.Status == "error") && len(st.LogEntries) == 0 {
			break
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("build %s still %s after 20m:\n%s", name, st.Status, strings.Join(all, "\n"))
		}
		if len(st.LogEntries) < 100 {
			time.Sleep(time.Second)
		}
	}
	return st, strings.Join(all, "\n")
}

// TestBuildE2E drives template builds through the HTTP API of a real
// aenvd with real QEMU VMs: an image in a real registry, a build with RUN,
// ENV, ARG, WORKDIR, USER, COPY, startCmd and readyCmd, a sandbox from the
// built template (checked through its agent), a failing RUN step, and bad
// input (missing image, wrong platform, files never uploaded).
func TestBuildE2E(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("aenvd needs root (network namespaces, taps); CI runs as root")
	}
	if testing.Short() {
		t.Skip("-short: this test boots VMs (CI runs without -short)")
	}
	guestassets.Get(t)
	layer := smallImageLayer(t)
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer reg.Close()
	host := strings.TrimPrefix(reg.URL, "http://")
	pushImage(t, host, "small:v1", "amd64", layer)
	pushImage(t, host, "small:arm", "arm64", layer)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	n, err := aenvdtest.Start(ctx, aenvdtest.Options{Prefix: "adbuild", CIDRBase: 87, Env: []string{
		"AENVD_IMAGE_INSECURE_REGISTRIES=" + host, "AENVD_IMAGE_ALLOWED_REGISTRIES=" + host,
		"AENVD_IMAGE_ROOTFS_SIZE_MIB=256", "AENVD_IMAGE_READY_TIMEOUT=2m",
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	defer func() {
		if t.Failed() {
			t.Logf("aenvd log:\n%s", n.Logs())
		}
	}()
	c := buildClient{t: t, n: n}

	files, hash := filesArchive(t)
	spec := map[string]any{
		"fromImage": host + "/small:v1",
		"steps": []map[string]any{
			{"type": "ENV", "args": []string{"GREETING", "hello world"}},
			{"type": "RUN", "args": []string{`echo "run as $(id -un) in $(pwd)"`}},
			{"type": "USER", "args": []string{"root"}},
			{"type": "WORKDIR", "args": []string{"/app"}},
			{"type": "ARG", "args": []string{"BUILDONLY", "42"}},
			{"type": "RUN", "args": []string{`echo "$GREETING $(id -un) $(pwd) $FROM_IMAGE $BUILDONLY" > out.txt`}},
			{"type": "COPY", "args": []string{"src", "data/", "user"}, "filesHash": hash},
			{"type": "COPY", "args": []string{"conf.txt", "/etc/my.conf", "", "0600"}, "filesHash": hash},
			{"type": "USER", "args": []string{"user"}},
			{"type": "WORKDIR", "args": []string{"work"}},
			{"type": "RUN", "args": []string{`id -un > who.txt && touch /app/data/written-by-user`}},
		},
		"startCmd": `echo started > /tmp/started.txt; exec sleep 100000`,
		"readyCmd": `test -f /tmp/started.txt`,
	}
	body, _ := json.Marshal(spec)
	tid, bid, st, logs := c.build("busy-box", string(body), map[string][]byte{hash: files})
	if st.Status != "ready" {
		t.Fatalf("build: %s (reason %+v)\n%s", st.Status, st.Reason, logs)
	}
	for _, want := range []string{"pulling " + host + "/small:v1", "run as user in /home/user", "ready command succeeded"} {
		if !strings.Contains(logs, want) {
			t.Errorf("build logs lack %q:\n%s", want, logs)
		}
	}

	// Builds and built templates survive a restart of aenvd.
	if err := n.Stop(syscall.SIGTERM); err != nil {
		t.Fatalf("stop aenvd: %v", err)
	}
	if err := n.Restart(ctx, 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	var after buildStatus
	json.Unmarshal(c.call("GET", "/templates/"+tid+"/builds/"+bid+"/status?level=warn", "", http.StatusOK), &after)
	if after.Status != "ready" {
		t.Fatalf("status after restart: %+v", after)
	}
	// The template is listed, found by its name, and sandboxes start from it by name.
	var alias struct {
		TemplateID string `json:"templateID"`
	}
	json.Unmarshal(c.call("GET", "/templates/aliases/busy-box", "", http.StatusOK), &alias)
	if alias.TemplateID != tid {
		t.Fatalf("alias: %+v, want %s", alias, tid)
	}
	if l := string(c.call("GET", "/v2/templates", "", http.StatusOK)); !strings.Contains(l, `"templateID":"`+tid+`"`) || !strings.Contains(l, `"busy-box"`) {
		t.Fatalf("template list: %s", l)
	}
	sbx, err := n.Create(`{"templateID":"busy-box","timeout":300}`)
	if err != nil {
		t.Fatal(err)
	}
	hc := aenvdtest.AgentClient(sbx)
	run := func(user, cmd string) string {
		t.Helper()
		var opts []agentclient.Option
		if user != "" {
			opts = append(opts, agentclient.WithUser(user))
		}
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Minute)
		defer rcancel()
		out, errOut, code, err := agentclient.RunWith(rctx, n.Proxy, hc, opts, "/bin/bash", "-l", "-c", cmd)
		if err != nil || code != 0 {
			t.Fatalf("%s: exit %d, %v\n%s%s", cmd, code, err, out, errOut)
		}
		return strings.TrimSpace(string(out))
	}
	checks := []struct{ user, cmd, want string }{
		{"", "cat /app/out.txt", "hello world root /app yes 42"},
		{"", `echo "$(id -un) $(pwd) $GREETING [$BUILDONLY]"`, "user /app/work hello world []"},
		{"", "cat /app/work/who.txt", "user"},
		{"", "stat -c '%U %a' /app/data/a.txt /app/data/sub/b.sh /app/data/written-by-user /etc/my.conf", "user 644\nuser 755\nuser 644\nroot 600"},
		{"root", "cat /etc/my.conf /app/data/a.txt && /app/data/sub/b.sh", "conf\nalpha\nbeta"},
		{"", "cat /tmp/started.txt", "started"},
	}
	for _, ck := range checks {
		if got := run(ck.user, ck.cmd); got != ck.want {
			t.Errorf("%s: %q, want %q", ck.cmd, got, ck.want)
		}
	}
	// In use: deletion is refused until the sandbox is gone.
	c.call("DELETE", "/templates/busy-box", "", http.StatusConflict)
	c.call("DELETE", "/sandboxes/"+sbx, "", http.StatusNoContent)

	// A failing RUN step (from the built template: a restore, no cold boot).
	failSpec := `{"fromTemplate":"busy-box","steps":[{"type":"RUN","args":["echo about to fail; echo on stderr >&2; exit 3"]},{"type":"RUN","args":["echo never"]}]}`
	_, _, st, logs = c.build("failing", failSpec, nil)
	if st.Status != "error" || st.Reason == nil || st.Reason.Step != "1" || !strings.Contains(st.Reason.Message, "exited with code 3") ||
		!strings.Contains(st.Reason.Message, "about to fail") {
		t.Fatalf("failing step: %s %+v\n%s", st.Status, st.Reason, logs)
	}
	if !strings.Contains(logs, "\n[1 info] about to fail\n") || !strings.Contains(logs, "\n[1 info] on stderr\n") || strings.Contains(logs, "echo never") {
		t.Errorf("failing build logs:\n%s", logs)
	}
	crashCommits(t, c)

	// Failed templates are deleted like any; then the template is unused.
	c.call("DELETE", "/templates/failing", "", http.StatusNoContent)
	c.call("DELETE", "/templates/busy-box", "", http.StatusNoContent)
	c.call("GET", "/templates/aliases/busy-box", "", http.StatusNotFound)
	if _, err := n.Create(`{"templateID":"busy-box","timeout":30}`); err == nil {
		t.Fatal("sandbox from a deleted template")
	}

	// Bad input: each fails with a clear reason and boots nothing.
	for _, bad := range []struct{ name, spec, want string }{
		{"missing", `{"fromImage":"` + host + `/nosuch:v1"}`, "NAME_UNKNOWN"},
		{"arm", `{"fromImage":"` + host + `/small:arm"}`, "linux/arm64, want linux/amd64"},
	} {
		_, _, st, logs := c.build(bad.name, bad.spec, nil)
		if st.Status != "error" || st.Reason == nil || !strings.Contains(st.Reason.Message, bad.want) || st.Reason.Step != "base" {
			t.Errorf("%s: %s %+v\n%s", bad.name, st.Status, st.Reason, logs)
		}
	}
	var created struct {
		TemplateID string `json:"templateID"`
		BuildID    string `json:"buildID"`
	}
	json.Unmarshal(c.call("POST", "/v3/templates", `{"name":"bad-requests"}`, http.StatusAccepted), &created)
	path := "/v2/templates/" + created.TemplateID + "/builds/" + created.BuildID
	c.call("POST", path, `{"fromImage":"elsewhere.example.com/x:1"}`, http.StatusBadRequest)
	c.call("POST", path, `{}`, http.StatusBadRequest)
	c.call("POST", path, `{"fromImage":"`+host+`/small:v1","steps":[{"type":"COPY","args":["a","/b"],"filesHash":"`+strings.Repeat("0", 64)+`"}]}`, http.StatusBadRequest)
	c.call("POST", path, `{"fromImage":"`+host+`/small:v1","steps":[{"type":"HEALTHCHECK","args":["x"]}]}`, http.StatusBadRequest)
	if code, b, _, err := c.n.Call("PUT", "/templates/"+created.TemplateID+"/files/"+strings.Repeat("0", 64)+"?token="+strings.Repeat("0", 64), "", "x"); err != nil || code != http.StatusUnauthorized {
		t.Errorf("upload with a forged token: %d %s %v, want 401", code, b, err)
	}
	c.call("GET", "/templates/"+created.TemplateID+"/files/nothex", "", http.StatusBadRequest)
	c.call("POST", "/v2/templates/nosuch/builds/"+created.BuildID, `{"fromImage":"`+host+`/small:v1"}`, http.StatusNotFound)
	c.call("GET", "/templates/"+created.TemplateID+"/builds/nosuch/status", "", http.StatusNotFound)
	c.call("DELETE", "/templates/base", "", http.StatusConflict)
}
