package blob

import (
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"syscall"
)

// Mapped is a local file read through a read-only shared memory mapping: a
// read is a copy from the page cache with no system call, which matters for a
// stack where one request becomes several pieces in several layer files.
// Sealed layers are immutable; if a file is truncated under its mapping
// anyway, the fault is turned into an error instead of crashing the process.
type Mapped struct {
	f     *os.File
	fd    int
	m     []byte
	guard fdGuard
}

// OpenMapped maps a local file. Empty files cannot be mapped: use OpenFile.
func OpenMapped(path string) (*Mapped, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open blob: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open blob %s: %w", path, err)
	}
	if st.Size() == 0 || int64(int(st.Size())) != st.Size() {
		f.Close()
		return nil, fmt.Errorf("open blob %s: cannot map a file of %d bytes", path, st.Size())
	}
	m, err := syscall.Mmap(int(f.Fd()), 0, int(st.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("open blob %s: mmap: %w", path, err)
	}
	return &Mapped{f: f, fd: int(f.Fd()), m: m}, nil
}

// preadThreshold is the read size from which pread beats copying from the
// mapping: the kernel copies from the page cache through its own large-page
// map, while a copy from the mapping walks 4 KiB user pages.
const preadThreshold = 64 << 10

// ReadAt copies from the mapping (small reads) or preads (large reads).
func (b *Mapped) ReadAt(p []byte, off int64) (n int, err error) {
	if off < 0 {
		return 0, fmt.Errorf("read blob %s: negative offset", b.f.Name())
	}
	if len(p) >= preadThreshold {
		return b.f.ReadAt(p, off)
	}
	if off >= int64(len(b.m)) {
		return 0, io.EOF
	}
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		if r := recover(); r != nil {
			n, err = 0, fmt.Errorf("read blob %s at %d: the mapped file changed underneath (truncated?): %v", b.f.Name(), off, r)
		}
	}()
	n = copy(p, b.m[off:])
	if n < len(p) {
		err = io.EOF
	}
	return n, err
}

func (b *Mapped) Size() int64  { return int64(len(b.m)) }
func (b *Mapped) Name() string { return b.f.Name() }

// Close unmaps and closes the file.
func (b *Mapped) Close() error {
	b.guard.closeWait()
	err := syscall.Munmap(b.m)
	if cerr := b.f.Close(); err == nil {
		err = cerr
	}
	return err
}

// OpenLocal opens a local file mapped when mmap is set and mapping works,
// else read with pread.
func OpenLocal(path string, mmap bool) (Blob, error) {
	if mmap {
		if m, err := OpenMapped(path); err == nil {
			return m, nil
		}
	}
	return OpenFile(path)
}
