// Package blockcheck is the one conformance suite for block devices that
// serve a stacked image (ublk, kernel NBD, loop): a three-layer image
// fixture with its flattened bytes as the model, and checks that a device
// node gives exactly those bytes, keeps random writes (checked against the
// model by checksum, through O_DIRECT so the server, not the page cache,
// answers), makes them durable on flush, and zeroes discarded and
// write-zeroed ranges. The checks need the device's kernel driver, so they
// run inside the kernel lane.
package blockcheck

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/storage/image"
)

// Fixture is a three-layer image and its flattened contents.
type Fixture struct {
	Config string // image config (two sealed lowers and a writable upper)
	Model  []byte // what the flattened image reads as
}

// NewFixture builds a size-byte image in dir: a base layer with data, a
// second layer that overwrites and trims some of it, and an upper with more
// writes; every write and trim is applied to the model too, and the model
// is checked against the opened image before it is returned.
func NewFixture(t testing.TB, dir string, size int64, seed uint64) *Fixture {
	t.Helper()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(seed, 1))
	model := make([]byte, size)
	var lowers []string
	for layer := range 3 {
		cfg := filepath.Join(dir, fmt.Sprintf("disk.%d.json", layer))
		if _, err := image.Create(ctx, cfg, image.CreateSpec{Lowers: lowers, Size: size}); err != nil {
			t.Fatal(err)
		}
		im, err := image.Open(ctx, cfg, image.Options{})
		if err != nil {
			t.Fatal(err)
		}
		for range 16 {
			off, n := span(rng, size, 256<<10)
			b := fill(rng, int(n))
			if _, err := im.WriteAt(b, off); err != nil {
				t.Fatal(err)
			}
			copy(model[off:], b)
		}
		if layer > 0 {
			for range 4 {
				off, n := span(rng, size, 128<<10)
				if err := im.Trim(off, n); err != nil {
					t.Fatal(err)
				}
				clear(model[off : off+n])
			}
		}
		if layer == 2 {
			if err := im.Flush(); err != nil {
				t.Fatal(err)
			}
			checkReader(t, "fixture image", im, model)
			if err := im.Close(); err != nil {
				t.Fatal(err)
			}
			return &Fixture{Config: cfg, Model: model}
		}
		name := fmt.Sprintf("layer%d.lsmt", layer)
		if _, err := im.Commit(ctx, filepath.Join(dir, name), image.CommitOptions{}); err != nil {
			t.Fatal(err)
		}
		im.Close()
		lowers = append(lowers, name)
	}
	panic("unreachable")
}

// Open opens the fixture's image for a server.
func (f *Fixture) Open(t testing.TB, readOnly bool) *image.Image {
	t.Helper()
	im, err := image.Open(context.Background(), f.Config, image.Options{ReadOnly: readOnly})
	if err != nil {
		t.Fatal(err)
	}
	return im
}

// span picks a 4 KiB-aligned range of at most max bytes inside size.
func span(rng *rand.Rand, size, max int64) (off, n int64) {
	n = (1 + rng.Int64N(max/4096)) * 4096
	off = rng.Int64N((size-n)/4096+1) * 4096
	return off, n
}

func fill(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := 0; i < n; i += 8 {
		v := rng.Uint64()
		for j := 0; j < 8 && i+j < n; j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

func checkReader(t testing.TB, what string, r io.ReaderAt, model []byte) {
	t.Helper()
	got := make([]byte, len(model))
	if _, err := r.ReadAt(got, 0); err != nil && err != io.EOF {
		t.Fatalf("%s: read: %v", what, err)
	}
	if !bytes.Equal(got, model) {
		t.Fatalf("%s: contents differ from the model at byte %d", what, firstDiff(got, model))
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// Device is a block device under test.
type Device struct {
	Path    string
	Model   []byte       // updated by the checks as they write
	Backend io.ReaderAt  // what the server serves; checked after flushes
	Flushed func() error // optional: called after a device flush, before the backend is read
}

// CheckAll runs every check on a writable device in order.
func CheckAll(t *testing.T, d *Device) {
	t.Run("ExactBytes", func(t *testing.T) { CheckExact(t, d) })
	t.Run("RandomIO", func(t *testing.T) { CheckRandomIO(t, d, 7) })
	t.Run("Flush", func(t *testing.T) { CheckFlush(t, d) })
	t.Run("Discard", func(t *testing.T) { CheckDiscard(t, d) })
}

// CheckExact reads the whole device (direct I/O) and compares it with the model.
func CheckExact(t testing.TB, d *Device) {
	t.Helper()
	f := openDirect(t, d.Path, os.O_RDONLY)
	defer f.Close()
	if size := deviceSize(t, f); size != int64(len(d.Model)) {
		t.Fatalf("%s: size %d, want %d", d.Path, size, len(d.Model))
	}
	buf := aligned(t, 1<<20)
	for off := 0; off < len(d.Model); off += len(buf) {
		n := min(len(buf), len(d.Model)-off)
		if _, err := f.ReadAt(buf[:n], int64(off)); err != nil {
			t.Fatalf("%s: read at %d: %v", d.Path, off, err)
		}
		if !bytes.Equal(buf[:n], d.Model[off:off+n]) {
			t.Fatalf("%s: bytes at %d differ from the flattened image (first at %d)", d.Path, off, off+firstDiff(buf[:n], d.Model[off:off+n]))
		}
	}
}

// CheckRandomIO writes random ranges and reads random ranges back, both
// direct, comparing checksums with the model.
func CheckRandomIO(t testing.TB, d *Device, seed uint64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 2))
	f := openDirect(t, d.Path, os.O_RDWR)
	defer f.Close()
	size := int64(len(d.Model))
	buf := aligned(t, 256<<10)
	for i := range 100 {
		off, n := span(rng, size, int64(len(buf)))
		if i%2 == 0 {
			copy(buf, fill(rng, int(n)))
			if _, err := f.WriteAt(buf[:n], off); err != nil {
				t.Fatalf("%s: write %d at %d: %v", d.Path, n, off, err)
			}
			copy(d.Model[off:], buf[:n])
			continue
		}
		if _, err := f.ReadAt(buf[:n], off); err != nil {
			t.Fatalf("%s: read %d at %d: %v", d.Path, n, off, err)
		}
		if sha256.Sum256(buf[:n]) != sha256.Sum256(d.Model[off:off+n]) {
			t.Fatalf("%s: read %d at %d: checksum differs from the model", d.Path, n, off)
		}
	}
}

// CheckFlush syncs the device and compares the backend with the model.
func CheckFlush(t testing.TB, d *Device) {
	t.Helper()
	f := openDirect(t, d.Path, os.O_RDWR)
	defer f.Close()
	buf := aligned(t, 4096)
	copy(buf, bytes.Repeat([]byte("flushed!"), 512))
	if _, err := f.WriteAt(buf, 8192); err != nil {
		t.Fatal(err)
	}
	copy(d.Model[8192:], buf)
	if err := f.Sync(); err != nil {
		t.Fatalf("%s: fsync: %v", d.Path, err)
	}
	if d.Flushed != nil {
		if err := d.Flushed(); err != nil {
			t.Fatal(err)
		}
	}
	if d.Backend != nil {
		checkReader(t, d.Path+" backend after flush", d.Backend, d.Model)
	}
}

// CheckDiscard discards one range (BLKDISCARD) and zeroes another
// (BLKZEROOUT); both read back as zeroes, on the device and the backend.
func CheckDiscard(t testing.TB, d *Device) {
	t.Helper()
	f := openDirect(t, d.Path, os.O_RDWR)
	defer f.Close()
	for _, c := range []struct {
		req      uint
		off, len uint64
	}{{unix.BLKDISCARD, 1 << 20, 256 << 10}, {unix.BLKZEROOUT, 3 << 20, 64 << 10}} {
		r := [2]uint64{c.off, c.len}
		if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), uintptr(c.req), uintptr(unsafe.Pointer(&r))); e != 0 {
			t.Fatalf("%s: ioctl %#x on %d+%d: %v", d.Path, c.req, c.off, c.len, e)
		}
		clear(d.Model[c.off : c.off+c.len])
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	CheckExact(t, d)
	if d.Backend != nil {
		checkReader(t, d.Path+" backend after discard", d.Backend, d.Model)
	}
}

func openDirect(t testing.TB, path string, flag int) *os.File {
	t.Helper()
	f, err := os.OpenFile(path, flag|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func deviceSize(t testing.TB, f *os.File) int64 {
	t.Helper()
	var size uint64
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKGETSIZE64, uintptr(unsafe.Pointer(&size))); e != 0 {
		t.Fatalf("%s: BLKGETSIZE64: %v", f.Name(), e)
	}
	return int64(size)
}

// aligned returns a page-aligned buffer for direct I/O.
func aligned(t testing.TB, n int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}
