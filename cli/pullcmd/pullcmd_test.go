package pullcmd

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
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
	args := []string{"pull", host + "/small:v1", "--cache", cache, "--name", "small", "--agent", agent,
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
	if _, err := run(t, host+"/small:v1", "--cache", cache, "--name", "../bad"); err == nil {
		t.Fatal("invalid name accepted")
	}
	if out, err := run(t, host+"/missing:v1", "--cache", cache); err == nil || !strings.Contains(err.Error(), "NAME_UNKNOWN") {
		t.Fatalf("missing image: %v\n%s", err, out)
	}
}
