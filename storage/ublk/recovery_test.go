//go:build linux

package ublk_test

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/internal/kernellane/blockcheck"
	"github.com/agentenv/agentenv/storage/ublk"
)

func sha256Sum(b []byte) [32]byte { return sha256.Sum256(b) }

func alignedBuf(n int) []byte {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		panic(err)
	}
	return b
}

// TestDeviceRecovery kills the server process in the middle of a stream
// of writes and reads, starts a new one that recovers the device, and
// checks the stream completes against the model (the request the dead
// server held is reissued, and writes it answered before the next flush
// are kept by the image's pending journal) and the device ends with the
// model's bytes.
func TestDeviceRecovery(t *testing.T) {
	needUblk(t)
	fx := blockcheck.NewFixture(t, t.TempDir(), 8<<20, 4)
	a := startHelper(t, helperEnv+"=serve", "AENV_UBLK_CONFIG="+fx.Config)
	id, err := strconv.Atoi(a.expect(t, "READY"))
	if err != nil {
		t.Fatal(err)
	}
	path := fmt.Sprintf("/dev/ublkb%d", id)
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rng := rand.New(rand.NewPCG(5, 5))
	buf := alignedBuf(128 << 10)
	const ops, killAt = 80, 30
	done := make(chan error, 1)
	progress := make(chan int, ops)
	go func() {
		for i := range ops {
			off := rng.Int64N(int64(len(fx.Model)-len(buf))/4096) * 4096
			if i%2 == 0 {
				for j := range buf {
					buf[j] = byte(rng.Uint32())
				}
				if _, err := f.WriteAt(buf, off); err != nil {
					done <- fmt.Errorf("op %d: write: %w", i, err)
					return
				}
				if err := f.Sync(); err != nil {
					done <- fmt.Errorf("op %d: fsync: %w", i, err)
					return
				}
				copy(fx.Model[off:], buf)
			} else {
				if _, err := f.ReadAt(buf, off); err != nil {
					done <- fmt.Errorf("op %d: read: %w", i, err)
					return
				}
				if !bytes.Equal(buf, fx.Model[off:off+int64(len(buf))]) {
					done <- fmt.Errorf("op %d: read at %d differs from the model", i, off)
					return
				}
			}
			progress <- i
		}
		done <- nil
	}()
	for i := range killAt {
		if got := <-progress; got != i {
			t.Fatalf("progress %d, want %d", got, i)
		}
	}
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	a.cmd.Wait()
	b := startHelper(t, helperEnv+"=serve", "AENV_UBLK_CONFIG="+fx.Config, "AENV_UBLK_RECOVER="+strconv.Itoa(id))
	if got := b.expect(t, "READY"); got != strconv.Itoa(id) {
		t.Fatalf("recovered device %s, want %d", got, id)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	info, err := ublk.DeviceInfo(ctx(t), uint32(id))
	if err != nil {
		t.Fatal(err)
	}
	if info.State != ublk.StateLive || info.ServerPID != b.cmd.Process.Pid {
		t.Fatalf("after recovery: %+v, want live and served by the new server %d", info, b.cmd.Process.Pid)
	}
	blockcheck.CheckExact(t, &blockcheck.Device{Path: path, Model: fx.Model})
	f.Close()
	b.in.Close()
	if err := b.cmd.Wait(); err != nil {
		t.Fatalf("recovered server: %v", err)
	}
	if _, err := os.Stat(path); err == nil {
		t.Fatalf("%s still there after its server closed it", path)
	}
}

// TestDevicePrivateMapping maps a read-only device privately in two
// processes: the page cache holds the device's pages once for both, each
// process writes its own bytes and sees only them, and the device still
// reads as the image.
func TestDevicePrivateMapping(t *testing.T) {
	needUblk(t)
	fx := blockcheck.NewFixture(t, t.TempDir(), 4<<20, 6)
	im := fx.Open(t, true)
	defer im.Close()
	d, err := ublk.Create(ctx(t), im, ublk.Options{ReadOnly: true, Depth: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	const n = 2 << 20
	sum := fmt.Sprintf("%x", sha256.Sum256(fx.Model[:n]))
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	before := cachedBytes(t)
	var hs []*helper
	for _, fill := range []string{"A", "B"} {
		hs = append(hs, startHelper(t, helperEnv+"=map", "AENV_UBLK_DEV="+d.Path, "AENV_UBLK_LEN="+strconv.Itoa(n),
			"AENV_UBLK_SUM="+sum, "AENV_UBLK_FILL="+fill))
	}
	for _, h := range hs {
		h.expect(t, "READ")
	}
	// Both processes have read every page of their mappings: the page
	// cache holds the device's pages once (readahead may add a little),
	// not once per process.
	if grown := cachedBytes(t) - before; grown < n || grown >= n+n/2 {
		t.Errorf("page cache grew by %d bytes for two mappings of %d bytes, want one copy", grown, n)
	}
	for _, h := range hs {
		fmt.Fprintln(h.in, "write")
		h.expect(t, "WROTE")
	}
	for _, h := range hs {
		fmt.Fprintln(h.in, "check")
		h.expect(t, "OK")
		if err := h.cmd.Wait(); err != nil {
			t.Fatal(err)
		}
	}
	if ro, err := readOnlyFlag(d.Path); err != nil || ro != 1 {
		t.Errorf("%s: BLKROGET %d, %v; want read-only", d.Path, ro, err)
	}
	blockcheck.CheckExact(t, &blockcheck.Device{Path: d.Path, Model: fx.Model})
}

// readOnlyFlag is the device's BLKROGET.
func readOnlyFlag(path string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return unix.IoctlGetInt(int(f.Fd()), unix.BLKROGET)
}

// cachedBytes is the size of the block devices' page cache (Buffers in
// /proc/meminfo: block device pages are counted there, not in Cached).
func cachedBytes(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Buffers:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no Buffers in /proc/meminfo")
	return 0
}
