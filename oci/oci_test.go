package oci

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	lt "github.com/agentenv/agentenv/oci/internal/layertest"
	"github.com/agentenv/agentenv/storage/image"
	"github.com/agentenv/agentenv/storage/zfile"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// testRegistry is a real registry server (go-containerregistry's) on
// httptest, optionally behind the Docker token flow, counting blob GETs and
// able to corrupt one blob.
type testRegistry struct {
	srv       *httptest.Server
	host      string
	user      string
	pass      string
	blobGets  atomic.Int64
	tokenGets atomic.Int64
	corrupt   atomic.Value // digest string whose blob is served altered
}

const testToken = "t0ken-for-tests"

func startRegistry(t *testing.T, user, pass string) *testRegistry {
	t.Helper()
	tr := &testRegistry{user: user, pass: pass}
	tr.corrupt.Store("")
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	tr.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/token" {
			tr.tokenGets.Add(1)
			if u, p, ok := r.BasicAuth(); !ok || u != user || p != pass {
				http.Error(w, "bad credentials", http.StatusUnauthorized)
				return
			}
			json.NewEncoder(w).Encode(map[string]string{"token": testToken})
			return
		}
		if user != "" && r.Header.Get("Authorization") != "Bearer "+testToken {
			w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm="http://%s/token",service="test"`, r.Host))
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED"}]}`, http.StatusUnauthorized)
			return
		}
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
			tr.blobGets.Add(1)
			if c := tr.corrupt.Load().(string); c != "" && strings.HasSuffix(r.URL.Path, "/blobs/"+c) {
				rec := httptest.NewRecorder()
				reg.ServeHTTP(rec, r)
				b := rec.Body.Bytes()
				if len(b) > 100 {
					b[len(b)/2] ^= 0xff
				}
				for k, v := range rec.Header() {
					w.Header()[k] = v
				}
				w.WriteHeader(rec.Code)
				w.Write(b)
				return
			}
		}
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(tr.srv.Close)
	tr.host = strings.TrimPrefix(tr.srv.URL, "http://")
	return tr
}

func (tr *testRegistry) writeOpts() []remote.Option {
	if tr.user == "" {
		return nil
	}
	return []remote.Option{remote.WithAuth(&authn.Basic{Username: tr.user, Password: tr.pass})}
}

func (tr *testRegistry) push(t *testing.T, ref string, img v1.Image) v1.Hash {
	t.Helper()
	r, err := name.ParseReference(tr.host + "/" + ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img, tr.writeOpts()...); err != nil {
		t.Fatalf("push %s: %v", r, err)
	}
	d, _ := img.Digest()
	return d
}

func (tr *testRegistry) pushIndex(t *testing.T, ref string, idx v1.ImageIndex) {
	t.Helper()
	r, err := name.ParseReference(tr.host + "/" + ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(r, idx, tr.writeOpts()...); err != nil {
		t.Fatalf("push index %s: %v", r, err)
	}
}

// gzipLayer is a tarball (gzip) layer; rawLayer an uncompressed one.
func gzipLayer(t *testing.T, tarb []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(tarb)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func rawLayer(tarb []byte) v1.Layer { return static.NewLayer(tarb, types.OCIUncompressedLayer) }

func buildImage(t *testing.T, arch string, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func platformIndex(imgs map[string]v1.Image) v1.ImageIndex {
	var adds []mutate.IndexAddendum
	for arch, img := range imgs {
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}}})
	}
	return mutate.AppendManifests(empty.Index, adds...)
}

// mountLayer exports a sealed layer's disk to a raw file and mounts it
// read-only (loop); the mount is removed at cleanup.
func mountLayer(t *testing.T, layer string) string {
	t.Helper()
	ctx := context.Background()
	im, err := image.OpenLayers(ctx, []string{layer}, image.Options{})
	if err != nil {
		t.Fatalf("open layer %s: %v", layer, err)
	}
	raw := filepath.Join(t.TempDir(), "disk.raw")
	err = image.Export(ctx, im, raw)
	im.Close()
	if err != nil {
		t.Fatalf("export %s: %v", layer, err)
	}
	if out, err := exec.Command("e2fsck", "-fn", raw).CombinedOutput(); err != nil {
		t.Fatalf("e2fsck of the converted filesystem: %v\n%s", err, out)
	}
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-o", "loop,ro", "-t", "ext4", raw, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount -o loop,ro %s: %v: %s", raw, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
		}
	})
	return mnt
}

// injected are the paths Convert writes; compared separately.
func injected(rel string) bool {
	switch rel {
	case "lost+found", "usr/bin/aenv-agent", "etc/hostname", "etc/hosts", "etc/resolv.conf", "etc/passwd", "etc/group", "etc/shadow", "home", "home/user":
		return true
	}
	return false
}

func testAgent(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "aenv-agent")
	if err := os.WriteFile(p, []byte("#!/bin/sh\necho fake agent for tests\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func checkInjected(t *testing.T, mnt string, wantUID int) {
	t.Helper()
	if b, err := os.ReadFile(filepath.Join(mnt, "usr/bin/aenv-agent")); err != nil || !strings.Contains(string(b), "fake agent") {
		t.Errorf("agent: %q, %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(mnt, "usr/bin/aenv-agent")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("agent mode: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(mnt, "etc/hosts")); !strings.Contains(string(b), "127.0.0.1\tlocalhost") || !strings.Contains(string(b), "aenv") {
		t.Errorf("/etc/hosts = %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(mnt, "etc/resolv.conf")); string(b) != "nameserver 8.8.8.8\n" {
		t.Errorf("/etc/resolv.conf = %q", b)
	}
	passwd, _ := os.ReadFile(filepath.Join(mnt, "etc/passwd"))
	if !strings.Contains(string(passwd), fmt.Sprintf("user:x:%d:", wantUID)) || !strings.HasPrefix(string(passwd), "root:") {
		t.Errorf("/etc/passwd = %q", passwd)
	}
	if b, _ := os.ReadFile(filepath.Join(mnt, "etc/group")); !strings.Contains(string(b), "\nuser:x:") {
		t.Errorf("/etc/group = %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(mnt, "etc/shadow")); !strings.Contains(string(b), "\nuser:") {
		t.Errorf("/etc/shadow = %q", b)
	}
	fi, err := os.Stat(filepath.Join(mnt, "home/user"))
	if err != nil || !fi.IsDir() {
		t.Errorf("home: %v", err)
	} else if uid := int(fi.Sys().(*syscall.Stat_t).Uid); uid != wantUID {
		t.Errorf("/home/user owned by %d, want %d", uid, wantUID)
	}
}

func TestPullConvertCraftedLayers(t *testing.T) {
	ctx := context.Background()
	reg := startRegistry(t, "alice", "s3cret")
	layers := lt.Crafted()
	var vl []v1.Layer
	for i, l := range layers {
		if i == 1 {
			vl = append(vl, rawLayer(lt.Tar(l))) // one uncompressed layer
		} else {
			vl = append(vl, gzipLayer(t, lt.Tar(l)))
		}
	}
	amd := buildImage(t, "amd64", vl...)
	arm := buildImage(t, "arm64", gzipLayer(t, lt.Tar([]lt.Entry{lt.File("arm", "wrong platform", 0o644)})))
	reg.pushIndex(t, "crafted:v1", platformIndex(map[string]v1.Image{"amd64": amd, "arm64": arm}))
	amdDigest, _ := amd.Digest()

	cache := t.TempDir()
	// Anonymous pulls are refused by the token server.
	anon, err := NewPuller(Options{CacheDir: cache, Keychain: authn.NewMultiKeychain()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := anon.Pull(ctx, reg.host+"/crafted:v1"); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("anonymous pull: %v, want 401", err)
	}
	p, err := NewPuller(Options{CacheDir: cache, Credentials: map[string]authn.AuthConfig{reg.host: {Username: "alice", Password: "s3cret"}},
		AllowedRegistries: []string{reg.host}, InsecureRegistries: []string{reg.host}})
	if err != nil {
		t.Fatal(err)
	}
	img, err := p.Pull(ctx, reg.host+"/crafted:v1")
	if err != nil {
		t.Fatal(err)
	}
	if img.Digest != amdDigest {
		t.Fatalf("pulled %s, want the linux/amd64 child %s", img.Digest, amdDigest)
	}
	if len(img.Layers) != 3 || reg.tokenGets.Load() == 0 {
		t.Fatalf("layers %d, token requests %d", len(img.Layers), reg.tokenGets.Load())
	}
	for _, l := range img.Layers {
		if _, err := os.Stat(filepath.Join(cache, "blobs/sha256", l.Digest.Hex)); err != nil {
			t.Errorf("layer %s not cached: %v", l.Digest, err)
		}
	}
	// A second pull (by digest) hits the layer cache: no blob is fetched
	// except the config.
	before := reg.blobGets.Load()
	img2, err := p.Pull(ctx, reg.host+"/crafted@"+amdDigest.String())
	if err != nil {
		t.Fatal(err)
	}
	if n := reg.blobGets.Load() - before; n > 1 || img2.Digest != amdDigest {
		t.Fatalf("second pull fetched %d blobs (digest %s)", n, img2.Digest)
	}

	agent := testAgent(t)
	rf, err := p.Convert(ctx, img, ConvertOptions{Agent: agent})
	if err != nil {
		t.Fatal(err)
	}
	if rf.Cached || rf.Bytes == 0 {
		t.Fatalf("first conversion: %+v", rf)
	}
	mnt := mountLayer(t, rf.Path)
	model := lt.Model{}
	for _, l := range layers {
		model.Apply(l)
	}
	for _, d := range lt.Compare(mnt, model, injected) {
		t.Error(d)
	}
	checkInjected(t, mnt, 1000)
	// The image's /etc/passwd root line is kept.
	if b, _ := os.ReadFile(filepath.Join(mnt, "etc/passwd")); !strings.HasPrefix(string(b), "root:x:0:0:root:/root:/bin/bash\n") {
		t.Errorf("/etc/passwd = %q", b)
	}
	rf2, err := p.Convert(ctx, img2, ConvertOptions{Agent: agent})
	if err != nil || !rf2.Cached || rf2.Path != rf.Path {
		t.Fatalf("second conversion: %+v, %v (want cached %s)", rf2, err, rf.Path)
	}
	// ZFile-compressed: a different key, the same filesystem.
	rfz, err := p.Convert(ctx, img, ConvertOptions{Agent: agent, Compress: &zfile.Options{}})
	if err != nil || rfz.Cached || rfz.Path == rf.Path {
		t.Fatalf("compressed conversion: %+v, %v", rfz, err)
	}
	if head, _ := os.ReadFile(rfz.Path); !bytes.Contains(head[:min(len(head), 64)], []byte("ZFile")) {
		t.Errorf("compressed layer does not start with a ZFile header: %q", head[:min(len(head), 16)])
	}
	mntz := mountLayer(t, rfz.Path)
	for _, d := range lt.Compare(mntz, model, injected) {
		t.Error("compressed:", d)
	}
	checkInjected(t, mntz, 1000)
	// Too small a filesystem: a clear mke2fs error, nothing cached.
	if _, err := p.Convert(ctx, img, ConvertOptions{SizeMiB: 1}); err == nil || !strings.Contains(err.Error(), "mke2fs") {
		t.Errorf("1 MiB filesystem: %v", err)
	}
	if ents, _ := filepath.Glob(filepath.Join(cache, "rootfs", ".build-*")); len(ents) != 0 {
		t.Errorf("build directories left: %v", ents)
	}
}
