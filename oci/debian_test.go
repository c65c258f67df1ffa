package oci

import (
	"archive/tar"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	guestimage "github.com/agentenv/agentenv/guest/image"
	"github.com/agentenv/agentenv/internal/testenv"
	lt "github.com/agentenv/agentenv/oci/internal/layertest"
)

// debianTree finds the debootstrap tree cached by the guest image builder
// (guest/image) on this node.
func debianTree(t testing.TB) string {
	t.Helper()
	trees, _ := filepath.Glob(filepath.Join(guestimage.DefaultCacheDir(), "rootfs", "*", "tree"))
	for _, tr := range trees {
		if _, err := os.Stat(filepath.Join(tr, "usr/bin/dpkg")); err == nil {
			return tr
		}
	}
	testenv.Missing(t, "no Debian tree cached under the guest image cache (run `aenv guest build` / `make guest` first)")
	return ""
}

// gnuTar tars paths of tree with GNU tar (a real producer's format: hard
// links, long names, xattrs, numeric owners).
func gnuTar(t testing.TB, tree string, paths ...string) []byte {
	t.Helper()
	args := append([]string{"--xattrs", "--xattrs-include=*", "--numeric-owner", "-C", tree, "-cf", "-"}, paths...)
	out, err := exec.Command("tar", args...).Output()
	if err != nil {
		t.Fatalf("tar %v: %v", paths, err)
	}
	return out
}

// TestPullConvertDebianTree converts an image whose layers are a subset of a
// Debian (debootstrap) root filesystem tarred by GNU tar, and compares the
// mounted result with the source tree file by file.
func TestPullConvertDebianTree(t *testing.T) {
	tree := debianTree(t)
	ctx := context.Background()
	reg := startRegistry(t, "", "")
	base := []string{"bin", "sbin", "lib", "lib64", "etc", "dev", "var", "tmp", "root", "run"}
	l1 := gzipLayer(t, gnuTar(t, tree, base...))
	l2 := rawLayer(gnuTar(t, tree, "usr/bin", "usr/sbin"))
	// On top: whiteouts and an opaque directory over the Debian content.
	top := []lt.Entry{lt.Whiteout("usr/sbin"), lt.Whiteout("usr/bin/perl"), lt.Opaque("etc/apt"),
		lt.File("etc/apt/sources.list", "deb http://deb.debian.org/debian bookworm main\n", 0o644),
		lt.File("usr/bin/dpkg", "replaced", 0o755)}
	l3 := gzipLayer(t, lt.Tar(top))
	reg.push(t, "debian:subset", buildImage(t, "amd64", l1, l2, l3))

	p, err := NewPuller(Options{CacheDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	img, err := p.Pull(ctx, reg.host+"/debian:subset")
	if err != nil {
		t.Fatal(err)
	}
	rf, err := p.Convert(ctx, img, ConvertOptions{Agent: testAgent(t)})
	if err != nil {
		t.Fatal(err)
	}
	full, err := lt.FromTree(tree)
	if err != nil {
		t.Fatal(err)
	}
	model := lt.Model{"usr": {Type: tar.TypeDir, Mode: 0o755}}
	for k, n := range full {
		top, _, _ := strings.Cut(k, "/")
		if strings.HasPrefix(k, "usr/bin") || strings.HasPrefix(k, "usr/sbin") || slices.Contains(base, top) {
			model[k] = n
		}
	}
	model.Apply(top)
	if _, ok := model["usr/bin/perl"]; ok {
		t.Fatal("model kept a whited-out file")
	}
	if len(model) < 500 {
		t.Fatalf("only %d entries in the subset", len(model))
	}
	mnt := mountLayer(t, rf.Path)
	diffs := lt.Compare(mnt, model, injected)
	for i, d := range diffs {
		if i == 50 {
			t.Errorf("... and %d more", len(diffs)-50)
			break
		}
		t.Error(d)
	}
	checkInjected(t, mnt, 1000)
	t.Logf("%d entries, %d MiB of layers, filesystem %d MiB", len(model), rf.Bytes>>20, rf.SizeMiB)
}
