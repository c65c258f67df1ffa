package qemu

import (
	"os"
	"path/filepath"
	"testing"
)

// TestProbeCacheRefusesPlantedFiles: the KVM probe result is kept in a
// directory of the user running aenvd (root), mode 0700, written atomically
// and never through a symbolic link, and a result planted by someone else
// is not believed. Nothing here boots a VM.
func TestProbeCacheRefusesPlantedFiles(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: plants files owned by another user")
	}
	const key = "aenv-kvm-probe-0123456789abcdef"
	base := t.TempDir()
	victim := filepath.Join(base, "victim")
	if err := os.WriteFile(victim, []byte("precious\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	unchanged := func(what string) {
		t.Helper()
		if b, _ := os.ReadFile(victim); string(b) != "precious\n" {
			t.Errorf("%s: the file a planted link points to now holds %q", what, b)
		}
	}

	// A symbolic link planted where the result is written.
	dir := filepath.Join(base, "cache")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(dir, key)); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := readProbeCache(dir, key); ok {
		t.Error("a result read through a symbolic link")
	}
	_ = writeProbeCache(dir, key, "kvm", "probed")
	unchanged("link at the result's name")
	if a, r, ok := readProbeCache(dir, key); !ok || a != "kvm" || r != "probed" {
		t.Errorf("read back %q %q %v, want kvm probed", a, r, ok)
	}
	if fi, err := os.Lstat(filepath.Join(dir, key)); err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm() != 0o600 {
		t.Errorf("result file: %v %v, want a regular file of mode 0600", fi.Mode(), err)
	}

	// The directory itself is a planted link.
	other := filepath.Join(base, "other")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	linked := filepath.Join(base, "linked")
	if err := os.Symlink(other, linked); err != nil {
		t.Fatal(err)
	}
	_ = writeProbeCache(linked, key, "kvm", "probed")
	if ents, _ := os.ReadDir(other); len(ents) != 0 {
		t.Errorf("wrote through a symbolic link to a directory: %v", ents)
	}

	// A directory of another user, with a result in it.
	foreign := filepath.Join(base, "foreign")
	if err := os.Mkdir(foreign, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(foreign, key), []byte("tcg\nplanted"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(foreign, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if a, _, ok := readProbeCache(foreign, key); ok {
		t.Errorf("believed %q from a directory owned by uid 65534", a)
	}
	if err := writeProbeCache(foreign, key, "kvm", "probed"); err == nil {
		t.Error("wrote into a directory owned by uid 65534")
	}

	// A world-writable directory of ours is tightened before use, and a
	// result file someone else owns is not believed.
	wide := filepath.Join(base, "wide")
	if err := os.Mkdir(wide, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(wide, 0o777)
	if err := os.WriteFile(filepath.Join(wide, key), []byte("tcg\nplanted"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(wide, key), 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if a, _, ok := readProbeCache(wide, key); ok {
		t.Errorf("believed %q from a file owned by uid 65534", a)
	}
	if err := writeProbeCache(wide, key, "kvm", "probed"); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(wide); fi.Mode().Perm() != 0o700 {
		t.Errorf("cache directory mode %v, want 0700", fi.Mode().Perm())
	}
	if a, _, ok := readProbeCache(wide, key); !ok || a != "kvm" {
		t.Errorf("own result after tightening: %q %v", a, ok)
	}
}

// TestProbeCacheDirIsPrivate: the default directory is not the shared temp
// directory any user can plant names in.
func TestProbeCacheDirIsPrivate(t *testing.T) {
	dir := probeCacheDir()
	if dir == "" {
		t.Skip("no cache directory for this user")
	}
	for d := dir; d != "/" && d != "."; d = filepath.Dir(d) {
		if fi, err := os.Stat(d); err == nil && fi.Mode().Perm()&0o002 != 0 {
			t.Errorf("probe cache %s lies under %s (mode %v), which every user can write", dir, d, fi.Mode().Perm())
		}
	}
}
