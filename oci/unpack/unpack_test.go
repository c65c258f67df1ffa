package unpack

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	lt "github.com/agentenv/agentenv/oci/internal/layertest"
	"golang.org/x/sys/unix"
)

func apply(t *testing.T, r *Root, entries []lt.Entry) error {
	t.Helper()
	_, err := r.Apply(context.Background(), bytes.NewReader(lt.Tar(entries)))
	return err
}

func TestApplyCraftedLayers(t *testing.T) {
	dir := t.TempDir()
	r, err := OpenRoot(filepath.Join(dir, "root"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	model := lt.Model{}
	for i, layer := range lt.Crafted() {
		if err := apply(t, r, layer); err != nil {
			t.Fatalf("layer %d: %v", i, err)
		}
		model.Apply(layer)
	}
	for _, d := range lt.Compare(r.Path(), model, nil) {
		t.Error(d)
	}
	// Spot checks that do not rely on the model.
	root := r.Path()
	mustNotExist(t, filepath.Join(root, "etc/gone"))
	mustNotExist(t, filepath.Join(root, "gonedir/x"))
	mustNotExist(t, filepath.Join(root, "opaque/lower1"))
	mustNotExist(t, filepath.Join(root, "opaque/sub"))
	if b, _ := os.ReadFile(filepath.Join(root, "etc/recreated")); string(b) != "second version" {
		t.Errorf("etc/recreated = %q", b)
	}
	var a, b unix.Stat_t
	unix.Lstat(filepath.Join(root, "etc/passwd"), &a)
	unix.Lstat(filepath.Join(root, "srv/passwd-link"), &b)
	if a.Ino != b.Ino || a.Nlink != 2 {
		t.Errorf("hard link: inodes %d/%d nlink %d", a.Ino, b.Ino, a.Nlink)
	}
	unix.Lstat(filepath.Join(root, "usr/bin/sudo-link"), &a)
	if a.Mode&0o7777 != 0o4755 || a.Mode&unix.S_IFMT != unix.S_IFREG {
		t.Errorf("setuid hard link kept mode %o", a.Mode)
	}
	unix.Lstat(filepath.Join(root, "tmp"), &a)
	if a.Mode&0o7777 != 0o1777 {
		t.Errorf("sticky tmp: mode %o", a.Mode&0o7777)
	}
	// Directory mtimes are set after the layer's children were written.
	unix.Lstat(filepath.Join(root, "srv/xdir"), &a)
	if a.Mtim.Sec != time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC).Unix() {
		t.Errorf("srv/xdir mtime %d", a.Mtim.Sec)
	}
}

func mustNotExist(t *testing.T, p string) {
	t.Helper()
	if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s: exists (err %v)", p, err)
	}
}

// TestApplyEscapes: names and hard links with ".." are rejected with a clear
// error; symbolic links leading outside (absolute or relative) are resolved
// inside the root, so writes through them land inside.
func TestApplyEscapes(t *testing.T) {
	for _, tc := range []struct {
		name    string
		layers  [][]lt.Entry
		wantErr string
		inside  string // a file the layers must have written inside the root
	}{
		{name: "dotdot", layers: [][]lt.Entry{{lt.File("../outside/pwned", "x", 0o644)}}, wantErr: `contains a ".." component`},
		{name: "dotdot-middle", layers: [][]lt.Entry{{lt.File("a/../../outside/pwned", "x", 0o644)}}, wantErr: `".."`},
		{name: "hardlink-out", layers: [][]lt.Entry{{lt.Hardlink("h", "../outside/secret")}}, wantErr: "hard link target"},
		{name: "hardlink-missing", layers: [][]lt.Entry{{lt.Hardlink("h", "nope")}}, wantErr: "hard link to \"nope\""},
		{name: "symlink-then-dotdot", layers: [][]lt.Entry{{lt.Symlink("s", "."), lt.File("s/../outside/pwned", "x", 0o644)}}, wantErr: `".."`},
		{name: "abs-symlink", layers: [][]lt.Entry{{lt.Symlink("evil", "OUTSIDE"), lt.File("evil/pwned", "x", 0o644)}}, wantErr: "does not exist inside the root"},
		{name: "rel-symlink", layers: [][]lt.Entry{{lt.Symlink("up", "../../../../../../OUTSIDE"), lt.File("up/pwned", "x", 0o644)}}, wantErr: "does not exist inside the root"},
		{name: "abs-symlink-later-layer", layers: [][]lt.Entry{{lt.Symlink("etc", "OUTSIDE")}, {lt.File("etc/pwned", "x", 0o644)}}, wantErr: "does not exist inside the root"},
		{name: "abs-symlink-in-root", layers: [][]lt.Entry{{lt.Dir("OUTSIDE", 0o755), lt.Symlink("evil", "OUTSIDE"), lt.File("evil/pwned", "x", 0o644)}}, inside: "OUTSIDE/pwned"},
		{name: "rel-symlink-in-root", layers: [][]lt.Entry{{lt.Dir("OUTSIDE", 0o755), lt.Symlink("up", "../../../../../../OUTSIDE")}, {lt.File("up/pwned", "x", 0o644)}}, inside: "OUTSIDE/pwned"},
		{name: "bin-symlink-in-root", layers: [][]lt.Entry{{lt.Dir("usr/bin", 0o755), lt.Symlink("bin", "usr/bin")}, {lt.File("bin/sh", "x", 0o755)}}, inside: "usr/bin/sh"},
		{name: "replace-symlink-file", layers: [][]lt.Entry{{lt.Symlink("f", "OUTSIDE/secret")}, {lt.File("f", "new", 0o644)}}, inside: "f"},
		{name: "whiteout-through-symlink", layers: [][]lt.Entry{{lt.Symlink("d", "OUTSIDE")}, {lt.Whiteout("d/secret")}}},
		{name: "opaque-through-symlink", layers: [][]lt.Entry{{lt.Symlink("d", "OUTSIDE")}, {lt.Opaque("d")}}, wantErr: "does not exist inside the root"},
		{name: "hardlink-through-symlink", layers: [][]lt.Entry{{lt.Symlink("d", "OUTSIDE"), lt.Hardlink("h", "d/secret")}}, wantErr: "hard link"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			outside := filepath.Join(dir, "outside")
			if err := os.MkdirAll(outside, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o644); err != nil {
				t.Fatal(err)
			}
			root := filepath.Join(dir, "build", "root")
			r, err := OpenRoot(root)
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			var got error
			for _, l := range tc.layers {
				for i := range l {
					l[i].Name = strings.ReplaceAll(l[i].Name, "OUTSIDE", outside[1:])
					l[i].Link = strings.ReplaceAll(l[i].Link, "OUTSIDE", outside)
				}
				if got = apply(t, r, l); got != nil {
					break
				}
			}
			if tc.wantErr != "" {
				if got == nil || !strings.Contains(got.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", got, tc.wantErr)
				}
			} else if got != nil {
				t.Fatalf("unexpected error: %v", got)
			}
			ents, _ := os.ReadDir(outside)
			if len(ents) != 1 || ents[0].Name() != "secret" {
				t.Errorf("outside directory changed: %v", ents)
			}
			if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "s" {
				t.Errorf("outside file changed: %q", b)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 2 {
				t.Errorf("temp dir holds %v, want build and outside only", ents)
			}
			if tc.inside != "" {
				p := filepath.Join(root, strings.ReplaceAll(tc.inside, "OUTSIDE", outside[1:]))
				if fi, err := os.Lstat(p); err != nil || !fi.Mode().IsRegular() {
					t.Errorf("want regular file %s inside the root: %v", p, err)
				}
			}
		})
	}
}

func TestClean(t *testing.T) {
	for in, want := range map[string]string{
		"a/b": "a/b", "./a/b/": "a/b", "/etc/passwd": "etc/passwd", "./": ".", "/": ".", "a//b/./c": "a/b/c",
	} {
		if got, err := Clean(in); err != nil || got != want {
			t.Errorf("Clean(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "..", "../a", "a/..", "a/../b", "/../etc", "a\x00b"} {
		if got, err := Clean(in); !errors.Is(err, ErrUnsafePath) {
			t.Errorf("Clean(%q) = %q, %v; want ErrUnsafePath", in, got, err)
		}
	}
}

func TestRootFiles(t *testing.T) {
	dir := t.TempDir()
	outside := filepath.Join(dir, "outside")
	os.MkdirAll(outside, 0o755)
	r, err := OpenRoot(filepath.Join(dir, "root"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// /etc is a symlink to the outside and etc/hosts a symlink too.
	if err := apply(t, r, []lt.Entry{lt.Symlink("etc", outside), lt.Symlink("link", outside+"/x")}); err != nil {
		t.Fatal(err)
	}
	if err := r.WriteFile("etc/hosts", []byte("x"), 0o644, 0, 0); !errors.Is(err, ErrUnsafePath) {
		t.Fatalf("write through a dangling symlink: %v", err)
	}
	if err := apply(t, r, []lt.Entry{lt.Dir(outside, 0o755)}); err != nil {
		t.Fatal(err)
	}
	if err := r.WriteFile("etc/hosts", []byte("127.0.0.1 localhost\n"), 0o644, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := r.WriteFile("link", []byte("replaced"), 0o600, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if err := r.MkdirAll("home/user/.config", 0o700, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("wrote outside: %v", ents)
	}
	b, err := r.ReadFile("/etc/hosts")
	if err != nil || string(b) != "127.0.0.1 localhost\n" {
		t.Fatalf("ReadFile = %q, %v", b, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(r.Path(), "link"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Uid != 1000 || st.Mode&0o777 != 0o600 {
		t.Fatalf("link replaced by %o uid %d: %v", st.Mode, st.Uid, err)
	}
	if err := unix.Lstat(filepath.Join(r.Path(), "home/user/.config"), &st); err != nil || st.Uid != 1000 || st.Mode&0o777 != 0o700 {
		t.Fatalf("mkdir: mode %o uid %d: %v", st.Mode, st.Uid, err)
	}
	if _, err := r.ReadFile("../outside/x"); !errors.Is(err, ErrUnsafePath) {
		t.Fatalf("ReadFile(../) = %v", err)
	}
}

// TestApplyOddHeaders: extreme times and owners give a result or a clear
// error, never a panic.
func TestApplyOddHeaders(t *testing.T) {
	r, err := OpenRoot(filepath.Join(t.TempDir(), "root"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	old := lt.File("old", "x", 0o644)
	old.ModTime = time.Unix(-1<<40, 0)
	future := lt.File("future", "x", 0o644)
	future.ModTime = time.Unix(1<<40, 5)
	if err := apply(t, r, []lt.Entry{old, future, lt.Dir("d", 0o755)}); err != nil {
		t.Fatalf("extreme mtimes: %v", err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(r.Path(), "future"), &st); err != nil || st.Mtim.Sec < 1<<32 {
		t.Errorf("future mtime %d: %v", st.Mtim.Sec, err)
	}
	bad := lt.File("neg", "x", 0o644)
	bad.UID = -5
	if err := apply(t, r, []lt.Entry{bad}); err == nil || !strings.Contains(err.Error(), "invalid owner") {
		t.Errorf("negative uid: %v", err)
	}
}

func TestApplyMaxBytes(t *testing.T) {
	r, err := OpenRoot(filepath.Join(t.TempDir(), "root"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.MaxBytes = 2000 // file content plus names and EntryCost per inode
	if err := apply(t, r, []lt.Entry{lt.File("a", strings.Repeat("x", 600), 0o644)}); err != nil {
		t.Fatal(err)
	}
	if err := apply(t, r, []lt.Entry{lt.File("b", strings.Repeat("x", 1200), 0o644)}); err == nil || !strings.Contains(err.Error(), "exceeds the limit") {
		t.Fatalf("second layer over the limit: %v", err)
	}
	mustNotExist(t, filepath.Join(r.Path(), "b"))
}
