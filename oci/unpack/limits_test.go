package unpack

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	lt "github.com/agentenv/agentenv/oci/internal/layertest"
	"golang.org/x/sys/unix"
)

func newRoot(t *testing.T) *Root {
	t.Helper()
	r, err := OpenRoot(filepath.Join(t.TempDir(), "root"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func many(n int, mk func(i int) lt.Entry) []lt.Entry {
	var out []lt.Entry
	for i := range n {
		out = append(out, mk(i))
	}
	return out
}

// kinds are layers of 200 entries of one kind each (none a regular file
// with content), to check that every limit counts every kind.
var kinds = map[string]func(i int) lt.Entry{
	"dir":     func(i int) lt.Entry { return lt.Dir(fmt.Sprintf("d%d", i), 0o755) },
	"symlink": func(i int) lt.Entry { return lt.Symlink(fmt.Sprintf("s%d", i), "/nowhere") },
	"fifo":    func(i int) lt.Entry { return lt.Fifo(fmt.Sprintf("p%d", i)) },
	"char":    func(i int) lt.Entry { return lt.Char(fmt.Sprintf("c%d", i), 1, 3) },
	"empty":   func(i int) lt.Entry { return lt.File(fmt.Sprintf("f%d", i), "", 0o644) },
}

// TestApplyEntryLimitEveryKind: the entry limit counts every kind of entry,
// whiteouts and hard links included, over all the layers of a root.
func TestApplyEntryLimitEveryKind(t *testing.T) {
	all := map[string]func(i int) lt.Entry{
		"hardlink": func(i int) lt.Entry { return lt.Hardlink(fmt.Sprintf("h%d", i), "target") },
		"whiteout": func(i int) lt.Entry { return lt.Whiteout(fmt.Sprintf("w%d", i)) },
	}
	for k, v := range kinds {
		all[k] = v
	}
	for kind, mk := range all {
		r := newRoot(t)
		r.MaxEntries = 100
		if err := apply(t, r, []lt.Entry{lt.File("target", "x", 0o644)}); err != nil {
			t.Fatal(err)
		}
		err := apply(t, r, many(200, mk))
		if err == nil || !strings.Contains(err.Error(), "entries") {
			t.Errorf("%s: 200 entries with a limit of 100: %v", kind, err)
		}
	}
	// The count runs over the layers of the root.
	r := newRoot(t)
	r.MaxEntries = 100
	if err := apply(t, r, many(60, kinds["dir"])); err != nil {
		t.Fatal(err)
	}
	if err := apply(t, r, many(60, kinds["symlink"])); err == nil || !strings.Contains(err.Error(), "entries") {
		t.Errorf("second layer past the entry limit: %v", err)
	}
}

// TestApplyInodeLimitEveryKind: every entry that makes an inode counts,
// directories made for missing parents too; hard links make none.
func TestApplyInodeLimitEveryKind(t *testing.T) {
	for kind, mk := range kinds {
		r := newRoot(t)
		r.MaxInodes = 100
		if err := apply(t, r, many(200, mk)); err == nil || !strings.Contains(err.Error(), "inodes") {
			t.Errorf("%s: 200 inodes with a limit of 100: %v", kind, err)
		}
	}
	r := newRoot(t)
	r.MaxInodes = 10
	deep := strings.Repeat("d/", 50) + "f"
	if err := apply(t, r, []lt.Entry{lt.File(deep, "x", 0o644)}); err == nil || !strings.Contains(err.Error(), "inodes") {
		t.Errorf("a file under 50 missing directories with an inode limit of 10: %v", err)
	}
	r = newRoot(t)
	r.MaxInodes = 10
	links := append([]lt.Entry{lt.File("target", "x", 0o644)}, many(50, func(i int) lt.Entry {
		return lt.Hardlink(fmt.Sprintf("h%d", i), "target")
	})...)
	if err := apply(t, r, links); err != nil {
		t.Errorf("50 hard links to one file with an inode limit of 10: %v", err)
	}
}

// TestApplyByteLimitEveryKind: what entries cost besides file content
// (names, link targets, xattrs, inodes) counts against the byte limit.
func TestApplyByteLimitEveryKind(t *testing.T) {
	long := "/" + strings.Repeat("x", 1000)
	for kind, mk := range map[string]func(i int) lt.Entry{
		"symlink": func(i int) lt.Entry { return lt.Symlink(fmt.Sprintf("s%d", i), long) },
		"dir": func(i int) lt.Entry {
			e := lt.Dir(fmt.Sprintf("d%d", i), 0o755)
			e.Xattrs = map[string]string{"user.x": strings.Repeat("v", 1000)}
			return e
		},
		"fifo": func(i int) lt.Entry { return lt.Fifo(fmt.Sprintf("%s%d", strings.Repeat("p", 200), i)) },
	} {
		r := newRoot(t)
		r.MaxBytes = 64 << 10
		if err := apply(t, r, many(300, mk)); err == nil || !strings.Contains(err.Error(), "bytes") {
			t.Errorf("%s: 300 entries of about 1 KiB each with a limit of 64 KiB: %v", kind, err)
		}
	}
}

// TestApplyPathLimit: entry names and link targets longer than the limit
// are refused before anything is made.
func TestApplyPathLimit(t *testing.T) {
	name := strings.Repeat("n", 150)
	for what, e := range map[string]lt.Entry{
		"file name":      lt.File(name, "x", 0o644),
		"directory name": lt.Dir(name, 0o755),
		"deep name":      lt.Fifo(strings.Repeat("a/", 75) + "p"),
		"symlink target": lt.Symlink("s", "/"+name),
		"hardlink name":  lt.Hardlink(name, "f"),
	} {
		r := newRoot(t)
		r.MaxPathLen = 100
		err := apply(t, r, []lt.Entry{lt.File("f", "x", 0o644), e})
		if err == nil || !strings.Contains(err.Error(), "path length") {
			t.Errorf("%s of 150 bytes with a limit of 100: %v", what, err)
		}
		if ents, _ := os.ReadDir(r.Path()); len(ents) != 1 {
			t.Errorf("%s: the root holds %d entries, want only f", what, len(ents))
		}
	}
}

// TestReadFileOnlyRegular: reading a file out of an image never opens a
// FIFO (it would block until a writer comes) or a device node (root opening
// a host device), also through a symbolic link, and bounds what it reads.
func TestReadFileOnlyRegular(t *testing.T) {
	r := newRoot(t)
	if err := apply(t, r, []lt.Entry{
		lt.Dir("dev", 0o755), lt.Char("dev/zero", 1, 5), lt.Dir("etc", 0o755),
		lt.Fifo("etc/passwd"), lt.Char("etc/group", 1, 3), lt.Symlink("etc/shadow", "/dev/zero"),
		lt.File("etc/hosts", "127.0.0.1 localhost\n", 0o644), lt.Symlink("etc/hosts.link", "/etc/hosts"),
	}); err != nil {
		t.Fatal(err)
	}
	in, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(in)
	for _, p := range []string{"dev/zero", "etc/passwd", "etc/group"} {
		if _, err := unix.InotifyAddWatch(in, filepath.Join(r.Path(), p), unix.IN_OPEN); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{"/etc/passwd", "/etc/group", "/etc/shadow", "dev/zero"} {
		done := make(chan error, 1)
		go func() {
			_, err := r.ReadFile(p)
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "not a regular file") {
				t.Errorf("ReadFile(%s): %v, want not a regular file", p, err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("ReadFile(%s) blocked", p)
			// Unblock the reader: a writer opens the FIFO and goes.
			if fd, err := unix.Open(filepath.Join(r.Path(), "etc/passwd"), unix.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
				unix.Close(fd)
			}
			<-done
		}
	}
	buf := make([]byte, 4096)
	if n, _ := unix.Read(in, buf); n > 0 {
		t.Errorf("a special file of the image was opened (%d bytes of inotify events)", n)
	}
	for _, p := range []string{"/etc/hosts", "etc/hosts.link"} {
		if b, err := r.ReadFile(p); err != nil || string(b) != "127.0.0.1 localhost\n" {
			t.Errorf("ReadFile(%s) = %q, %v", p, b, err)
		}
	}
	// A huge (sparse) file is refused by its size, not read into memory.
	if err := os.Truncate(filepath.Join(r.Path(), "etc/hosts"), MaxReadFile+1); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ReadFile("/etc/hosts"); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("ReadFile of a file larger than %d bytes: %v", MaxReadFile, err)
	}
}
