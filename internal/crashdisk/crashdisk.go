// Package crashdisk simulates a power loss for tests: it gives a test a real
// ext4 filesystem on a loop device, and Crash copies the backing file as it
// is at that moment (what the filesystem has written to its device: fsynced
// data, committed journal transactions and whatever writeback already did)
// and mounts the copy. Pages still dirty in the page cache are not in the
// copy, exactly as after a power cut, so a file that was not fsynced reads
// back empty or short, and a rename without a directory fsync may be lost.
//
// It needs root and loop devices; New skips the test with the reason when
// either is missing.
package crashdisk

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/testenv"
)

// Disk is a loop-mounted ext4 filesystem owned by one test.
type Disk struct {
	t    testing.TB
	dir  string // holds the images and mount points
	img  string
	root string // mount point of the live filesystem
	n    int
}

// New makes and mounts a fresh filesystem of sizeMiB, unmounted at cleanup.
func New(t testing.TB, sizeMiB int) *Disk {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("crashdisk: needs root to mount loop devices")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("crashdisk: no loop devices (/dev/loop-control)")
	}
	for _, tool := range []string{"mkfs.ext4", "mount", "umount"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Missing(t, "crashdisk: %s not installed", tool)
		}
	}
	d := &Disk{t: t, dir: t.TempDir()}
	d.img = filepath.Join(d.dir, "live.img")
	f, err := os.Create(d.img)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(int64(sizeMiB) << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	run(t, "mkfs.ext4", "-q", "-F", d.img)
	d.root = d.mount(d.img, "live")
	return d
}

// Root is the directory of the live filesystem.
func (d *Disk) Root() string { return d.root }

// Crash returns the root of a filesystem holding what the live one would
// hold after a power loss now. The live filesystem stays mounted and usable.
func (d *Disk) Crash() string {
	d.t.Helper()
	d.n++
	cp := filepath.Join(d.dir, fmt.Sprintf("crash-%d.img", d.n))
	// Read through the host's page cache of the backing file: that is what
	// the loop device has written, i.e. what the filesystem sent to its disk.
	run(d.t, "cp", "--sparse=always", d.img, cp)
	return d.mount(cp, fmt.Sprintf("crash-%d", d.n))
}

func (d *Disk) mount(img, name string) string {
	d.t.Helper()
	mp := filepath.Join(d.dir, name)
	if err := os.Mkdir(mp, 0o755); err != nil {
		d.t.Fatal(err)
	}
	run(d.t, "mount", "-t", "ext4", "-o", "loop", img, mp)
	d.t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", mp).CombinedOutput(); err != nil {
			d.t.Logf("crashdisk: umount %s: %v: %s", mp, err, strings.TrimSpace(string(out)))
		}
	})
	return mp
}

func run(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("crashdisk: %s %v: %v: %s", name, args, err, strings.TrimSpace(string(out)))
	}
}
