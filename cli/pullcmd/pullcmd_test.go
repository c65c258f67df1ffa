package pullcmd

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func TestPull(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")

	var tb bytes.Buffer
	w := tar.NewWriter(&tb)
	w.WriteHeader(&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755})
	w.WriteHeader(&tar.Header{Name: "etc/os-release", Typeflag: tar.TypeReg, Mode: 0o644, Size: 8})
	w.Write([]byte("ID=test\n"))
	w.Close()
	layer, err := tarball.LayerFromReader(bytes.NewReader(tb.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	img, _ = mutate.ConfigFile(img, cf)
	ref, _ := name.ParseReference(host + "/small:v1")
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}

	cache := t.TempDir()
	agent := filepath.Join(t.TempDir(), "aenv-agent")
	os.WriteFile(agent, []byte("agent"), 0o755)
	args := []string{"pull", "--local", host + "/small:v1", "--cache", cache, "--name", "small", "--agent", agent,
		"--insecure-registry", host, "--allowed-registry", host}
	out, err := run(t, append(args[1:], "--json")...)
	if err != nil {
		t.Fatalf("aenv pull: %v\n%s", err, out)
	}
	var res Result
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("output %q: %v", out, err)
	}
	d, _ := img.Digest()
	if res.Digest != d.String() || res.Cached || res.Name != "small" {
		t.Fatalf("result %+v, want digest %s", res, d)
	}
	if fi, err := os.Stat(res.Layer); err != nil || fi.Size() == 0 {
		t.Fatalf("layer %s: %v", res.Layer, err)
	}
	b, err := os.ReadFile(filepath.Join(cache, "names", "small.json"))
	if err != nil || !strings.Contains(string(b), res.Layer) {
		t.Fatalf("name record %q: %v", b, err)
	}
	// Again: cached, and the plain output is the layer path.
	out, err = run(t, args[1:]...)
	if err != nil || strings.TrimSpace(out) != res.Layer {
		t.Fatalf("second pull: %q, %v", out, err)
	}
	if _, err := run(t, "--local", host+"/small:v1", "--cache", cache, "--name", "../bad"); err == nil {
		t.Fatal("invalid name accepted")
	}
	if out, err := run(t, "--local", host+"/missing:v1", "--cache", cache); err == nil || !strings.Contains(err.Error(), "NAME_UNKNOWN") {
		t.Fatalf("missing image: %v\n%s", err, out)
	}
}

// TestPullOnServer: without --local, pull is a server-side build from the
// image with no steps, followed until ready.
func TestPullOnServer(t *testing.T) {
	var spec struct {
		FromImage string          `json:"fromImage"`
		StartCmd  string          `json:"startCmd"`
		ReadyCmd  string          `json:"readyCmd"`
		Steps     json.RawMessage `json:"steps"`
	}
	var created struct {
		Name     string `json:"name"`
		CPUCount int    `json:"cpuCount"`
		MemoryMB int    `json:"memoryMB"`
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v3/templates", func(w http.ResponseWriter, r *http.Request) {
		json.NewDecoder(r.Body).Decode(&created)
		w.WriteHeader(202)
		io.WriteString(w, `{"templateID":"t1","buildID":"b1","names":["x"]}`)
	})
	mux.HandleFunc("POST /v2/templates/t1/builds/b1", func(w http.ResponseWriter, r *http.Request) {
		json.NewDecoder(r.Body).Decode(&spec)
		w.WriteHeader(202)
	})
	mux.HandleFunc("GET /templates/t1/builds/b1/status", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"status":"ready","logEntries":[{"level":"info","message":"pulled"}]}`)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	t.Setenv("HOME", t.TempDir())
	t.Setenv("AENV_URL", srv.URL)
	t.Setenv("AENV_API_KEY", "k")
	out, err := run(t, "registry.example:5000/team/Py:3.13", "--start-cmd", "srv", "--ready-cmd", "true", "--cpu", "2", "--memory", "512", "--poll", "1ms", "-o", "json")
	if err != nil {
		t.Fatalf("pull: %v\n%s", err, out)
	}
	if created.Name != "py" || created.CPUCount != 2 || created.MemoryMB != 512 {
		t.Errorf("template request %+v", created)
	}
	if spec.FromImage != "registry.example:5000/team/Py:3.13" || spec.StartCmd != "srv" || spec.ReadyCmd != "true" || spec.Steps != nil {
		t.Errorf("build spec %+v", spec)
	}
	if !strings.Contains(out, "pulled\n") || !strings.Contains(out, `"templateID": "t1"`) {
		t.Errorf("output:\n%s", out)
	}
	if _, err := run(t, "x", "--cache", "/tmp"); err == nil || !strings.Contains(err.Error(), "--cache applies to --local only") {
		t.Errorf("local flag without --local: %v", err)
	}
	if _, err := run(t, "--local", "x", "--memory", "5"); err == nil || !strings.Contains(err.Error(), "--memory does not apply to --local") {
		t.Errorf("server flag with --local: %v", err)
	}
}

func TestDefaultName(t *testing.T) {
	for ref, want := range map[string]string{
		"ubuntu:22.04": "ubuntu", "docker.io/library/debian": "debian", "127.0.0.1:5000/a/b:v1": "b",
		"ghcr.io/x/My_Img@sha256:abc": "my_img", "": "image",
	} {
		if got := defaultName(ref); got != want {
			t.Errorf("defaultName(%q) = %q, want %q", ref, got, want)
		}
	}
}
