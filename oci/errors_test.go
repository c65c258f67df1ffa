package oci

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	lt "github.com/agentenv/agentenv/oci/internal/layertest"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// TestPullBadInput: each bad input gives a clear error, caches nothing bad
// and writes nothing outside the cache's build directories.
func TestPullBadInput(t *testing.T) {
	ctx := context.Background()
	reg := startRegistry(t, "", "")
	good := buildImage(t, "amd64", gzipLayer(t, lt.Tar([]lt.Entry{lt.File("etc/os-release", "ID=test\n", 0o644)})))
	reg.push(t, "good:v1", good)
	reg.pushIndex(t, "armonly:v1", platformIndex(map[string]v1.Image{"arm64": good}))
	reg.push(t, "armimage:v1", buildImage(t, "arm64", gzipLayer(t, lt.Tar([]lt.Entry{lt.File("a", "a", 0o644)}))))
	corruptLayer := gzipLayer(t, lt.Tar([]lt.Entry{lt.File("big", strings.Repeat("corrupt me ", 2000), 0o644)}))
	reg.push(t, "corrupt:v1", buildImage(t, "amd64", corruptLayer))
	cd, _ := corruptLayer.Digest()
	reg.corrupt.Store(cd.String())

	dir := t.TempDir()
	outside := filepath.Join(dir, "outside")
	if err := os.MkdirAll(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	reg.push(t, "dotdot:v1", buildImage(t, "amd64", gzipLayer(t, lt.Tar([]lt.Entry{lt.File("../../../outside/pwned", "x", 0o644)}))))
	reg.push(t, "abslink:v1", buildImage(t, "amd64",
		gzipLayer(t, lt.Tar([]lt.Entry{lt.Symlink("etc", outside)})),
		gzipLayer(t, lt.Tar([]lt.Entry{lt.File("etc/pwned", "x", 0o644)}))))
	reg.push(t, "hardlink:v1", buildImage(t, "amd64", gzipLayer(t, lt.Tar([]lt.Entry{lt.Hardlink("h", "../../outside/secret")}))))
	// A config whose diff ID does not match the layer's content.
	bad := buildImage(t, "amd64", gzipLayer(t, lt.Tar([]lt.Entry{lt.File("x", "x", 0o644)})))
	cf, _ := bad.ConfigFile()
	cf = cf.DeepCopy()
	cf.RootFS.DiffIDs[0] = v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("ab", 32)}
	bad, err := mutate.ConfigFile(bad, cf)
	if err != nil {
		t.Fatal(err)
	}
	reg.push(t, "diffid:v1", bad)

	cache := filepath.Join(dir, "cache")
	p, err := NewPuller(Options{CacheDir: cache})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ ref, want string }{
		{"missing:v1", "NAME_UNKNOWN"},
		{"good:nosuchtag", "MANIFEST_UNKNOWN"},
		{"armonly:v1", "no child with platform"},
		{"armimage:v1", "is for linux/arm64, want linux/amd64"},
		{"corrupt:v1", "sha256"},
	} {
		_, err := p.Pull(ctx, reg.host+"/"+tc.ref)
		if err == nil || !strings.Contains(err.Error(), tc.want) || errors.Is(err, ErrRefused) {
			t.Errorf("pull %s: %v, want an error containing %q (a registry's, not ErrRefused)", tc.ref, err, tc.want)
		}
	}
	if _, err := os.Stat(p.BlobPath(cd)); !os.IsNotExist(err) {
		t.Errorf("corrupt blob cached: %v", err)
	}
	strict, _ := NewPuller(Options{CacheDir: cache, AllowedRegistries: []string{"registry.example"}})
	if _, err := strict.Pull(ctx, reg.host+"/good:v1"); err == nil || !strings.Contains(err.Error(), "not in the allowed registries") || !errors.Is(err, ErrRefused) {
		t.Errorf("pull from a registry not allowed: %v", err)
	}
	if _, err := p.Pull(ctx, reg.host+"/good:v1"); err != nil {
		t.Fatalf("good image: %v", err)
	}
	for _, tc := range []struct{ ref, want string }{
		{"dotdot:v1", `contains a ".." component`},
		{"abslink:v1", "does not exist inside the root"},
		{"hardlink:v1", `contains a ".." component`},
		{"diffid:v1", "does not match diff ID"},
	} {
		img, err := p.Pull(ctx, reg.host+"/"+tc.ref)
		if err != nil {
			t.Errorf("pull %s: %v", tc.ref, err)
			continue
		}
		_, err = p.Convert(ctx, img, ConvertOptions{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("convert %s: %v, want an error containing %q", tc.ref, err, tc.want)
		}
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Errorf("wrote outside: %v", ents)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 2 {
		t.Errorf("%s holds %v, want cache and outside", dir, ents)
	}
	if ents, _ := os.ReadDir(filepath.Join(cache, "rootfs")); len(ents) != 0 {
		t.Errorf("failed conversions left %v", ents)
	}
	if tmp, _ := filepath.Glob(filepath.Join(cache, "blobs/sha256/.fetch-*")); len(tmp) != 0 {
		t.Errorf("partial downloads left: %v", tmp)
	}
}
