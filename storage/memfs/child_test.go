package memfs

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// A process must not fault on a FUSE mount it serves itself (see the
// package doc), so every mapping of an export is made by a child: this
// test binary run again with MEMFS_CHILD set.

func TestMain(m *testing.M) {
	RunKeeperIfAsked()
	if mode := os.Getenv("MEMFS_CHILD"); mode != "" {
		run := map[string]func() error{"map": childMain, "serve": serveChild, "read": readChild}[mode]
		if err := run(); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// mapCheck runs a child that opens path read-write (as QEMU 7.2 does),
// maps it MAP_PRIVATE maps times and compares every mapping with want;
// with scribble it writes into the mapping and checks the write stays in
// it; with syswrite it tries write(2) and ftruncate on the read-write
// descriptor, wants EPERM for both and the mapping unchanged.
func mapCheck(t *testing.T, path string, want []byte, maps int, scribble, syswrite bool) {
	t.Helper()
	ref := filepath.Join(t.TempDir(), "want")
	if err := os.WriteFile(ref, want, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "MEMFS_CHILD=map", "MEMFS_PATH="+path, "MEMFS_WANT="+ref,
		"MEMFS_MAPS="+strconv.Itoa(maps), "MEMFS_SCRIBBLE="+strconv.FormatBool(scribble),
		"MEMFS_SYSWRITE="+strconv.FormatBool(syswrite))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mapping child: %v\n%s", err, out)
	}
}

func childMain() error {
	want, err := os.ReadFile(os.Getenv("MEMFS_WANT"))
	if err != nil {
		return err
	}
	f, err := os.OpenFile(os.Getenv("MEMFS_PATH"), os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open read-write: %w", err)
	}
	defer f.Close()
	maps, _ := strconv.Atoi(os.Getenv("MEMFS_MAPS"))
	for i := range maps {
		m, err := unix.Mmap(int(f.Fd()), 0, len(want), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
		if err != nil {
			return fmt.Errorf("mmap: %w", err)
		}
		if !bytes.Equal(m, want) {
			return fmt.Errorf("mapping %d differs from the source", i)
		}
		if err := childWrites(f, m, want); err != nil {
			return err
		}
	}
	return nil
}

func childWrites(f *os.File, m, want []byte) error {
	if os.Getenv("MEMFS_SCRIBBLE") == "true" {
		for _, off := range []int{0, len(m) / 2, len(m) - 1} {
			m[off] ^= 0xff
			if m[off] == want[off] {
				return fmt.Errorf("a write to the private mapping at %d did not stick", off)
			}
		}
	}
	if os.Getenv("MEMFS_SYSWRITE") == "true" {
		if _, err := f.WriteAt([]byte("overwrite"), 0); !errors.Is(err, syscall.EPERM) {
			return fmt.Errorf("write(2) on the read-write descriptor: %v, want EPERM", err)
		}
		if err := f.Truncate(0); !errors.Is(err, syscall.EPERM) {
			return fmt.Errorf("ftruncate: %v, want EPERM", err)
		}
		if !bytes.Equal(m, want) {
			return errors.New("a refused write(2) changed the mapped bytes")
		}
	}
	return nil
}
