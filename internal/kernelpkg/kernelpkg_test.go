package kernelpkg

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ulikunitz/xz"

	"github.com/agentenv/agentenv/internal/testenv"
)

// tree writes an extracted kernel package at dir: vmlinuz and one
// lib/modules/<version>, and the package file's name when name is set.
func tree(t *testing.T, dir, name string) {
	t.Helper()
	for _, d := range []string{"boot", "lib/modules/6.12.0-test-cloud-amd64/kernel"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "boot", "vmlinuz-6.12.0-test-cloud-amd64"), []byte("kernel"), 0o644); err != nil {
		t.Fatal(err)
	}
	if name != "" {
		if err := os.WriteFile(filepath.Join(dir, "package"), []byte(name), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestFetchUsesTheCache: a cached tree is returned in each layout (the
// ref to a tree named by the package's hash, with or without the package
// name, and the older kernel/<package> tree) without apt-get, which the
// test hides: a fetch that tried to download would fail with
// ErrUnavailable, as the uncached package does.
func TestFetchUsesTheCache(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	const pkg = "linux-image-test"
	cases := []struct {
		name, ref, dir, pkgName string
	}{
		{"ref", "abc\n", "abc", "linux-image-6.12.0-test_6.12.0-1_amd64.deb"},
		{"ref without name", "abc\n", "abc", ""},
		{"older layout", "", pkg, "linux-image-6.12.0-test_6.12.0-1_amd64.deb"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cache := t.TempDir()
			tree(t, filepath.Join(cache, "kernel", c.dir), c.pkgName)
			if c.ref != "" {
				if err := os.WriteFile(filepath.Join(cache, "kernel", pkg+".ref"), []byte(c.ref), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			k, err := Fetch(t.Context(), cache, pkg, nil)
			if err != nil {
				t.Fatal(err)
			}
			if k.Package != c.pkgName || k.Version != "6.12.0-test-cloud-amd64" || k.Dir != filepath.Join(cache, "kernel", c.dir) ||
				k.Vmlinuz != filepath.Join(k.Dir, "boot", "vmlinuz-"+k.Version) || k.ModDir != filepath.Join(k.Dir, "lib/modules", k.Version) {
				t.Errorf("kernel %+v", k)
			}
		})
	}
	_, err := Fetch(t.Context(), t.TempDir(), pkg, nil)
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("an uncached package without apt-get: %v, want ErrUnavailable", err)
	}
	cache := t.TempDir()
	tree(t, filepath.Join(cache, "kernel", "abc"), "x.deb")
	os.Remove(filepath.Join(cache, "kernel", "abc", "boot", "vmlinuz-6.12.0-test-cloud-amd64"))
	os.WriteFile(filepath.Join(cache, "kernel", pkg+".ref"), []byte("abc\n"), 0o644)
	if _, err := Cached(cache, pkg); err == nil {
		t.Error("a tree without its vmlinuz counted as cached")
	}
}

// module writes a kernel module file: an ELF (a copy of a host binary)
// with a .modinfo section naming its dependencies; xz-compressed when the
// name ends in .xz.
func module(t *testing.T, path, depends string) {
	t.Helper()
	objcopy, err := exec.LookPath("objcopy")
	if err != nil {
		testenv.Missing(t, "objcopy is not installed (Debian package binutils)")
	}
	host, err := exec.LookPath("true")
	if err != nil {
		t.Skip("no host ELF binary to build a module from")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	info := filepath.Join(t.TempDir(), "modinfo")
	if err := os.WriteFile(info, []byte("license=GPL\x00depends="+depends+"\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	elfPath := strings.TrimSuffix(path, ".xz")
	if out, err := exec.Command(objcopy, "--add-section", ".modinfo="+info, host, elfPath).CombinedOutput(); err != nil {
		t.Fatalf("objcopy: %v: %s", err, out)
	}
	if !strings.HasSuffix(path, ".xz") {
		return
	}
	raw, err := os.ReadFile(elfPath)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	w, err := xz.NewWriter(&b)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(raw)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Remove(elfPath)
}

// TestResolveModules: dependencies come first, each once, read from the
// modules' .modinfo (compressed or not); built-in modules are skipped; an
// unknown module is an error naming what wanted it.
func TestResolveModules(t *testing.T) {
	mod := t.TempDir()
	module(t, filepath.Join(mod, "kernel/drivers/block/ublk_drv.ko.xz"), "blk-core")
	module(t, filepath.Join(mod, "kernel/drivers/block/blk_core.ko"), "")
	module(t, filepath.Join(mod, "kernel/drivers/block/nbd.ko.xz"), "blk_core,builtin_crc")
	module(t, filepath.Join(mod, "kernel/fs/bad.ko"), "missing_dep")
	if err := os.WriteFile(filepath.Join(mod, "modules.builtin"), []byte("kernel/lib/builtin_crc.ko\nkernel/lib/loop.ko\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	order, err := ResolveModules(mod, []string{"ublk_drv", "nbd", "loop"})
	want := []string{"kernel/drivers/block/blk_core.ko", "kernel/drivers/block/ublk_drv.ko.xz", "kernel/drivers/block/nbd.ko.xz"}
	if err != nil || !slices.Equal(order, want) {
		t.Fatalf("ResolveModules: %q, %v; want %q", order, err, want)
	}
	raw, err := ReadModule(filepath.Join(mod, "kernel/drivers/block/nbd.ko.xz"))
	if err != nil || !bytes.HasPrefix(raw, []byte("\x7fELF")) {
		t.Fatalf("ReadModule of a .ko.xz: %v (%d bytes)", err, len(raw))
	}
	if _, err := ResolveModules(mod, []string{"bad"}); err == nil || !strings.Contains(err.Error(), "missing_dep") || !strings.Contains(err.Error(), "bad") {
		t.Errorf("a module depending on an unknown one: %v", err)
	}
	if ModuleName("kernel/drivers/block/ublk-drv.ko.xz") != "ublk_drv" {
		t.Error("ModuleName does not fold - into _ or drop the suffix")
	}
}
