package nbd

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
)

// Backend is what an export serves. The method set mirrors os.File (ReadAt and
// WriteAt as io.ReaderAt/io.WriterAt) so that a plain file, a sparse in-memory
// disk or a stacked layered image all fit without adapters. The server calls
// ReadAt/WriteAt concurrently from many goroutines; implementations must allow that.
type Backend interface {
	io.ReaderAt
	io.WriterAt
	// Size is the export size in bytes; it does not change while exported.
	Size() int64
	// Flush makes every completed write durable.
	Flush() error
	// Trim says the range is no longer needed; later reads may return zeroes
	// or the old data (NBD semantics), so it may also be a no-op.
	Trim(off, length int64) error
	Close() error
}

// Zeroer is an optional Backend extension for NBD_CMD_WRITE_ZEROES: the range
// must read back as zeroes afterwards. Backends without it get zero-filled writes.
type Zeroer interface {
	WriteZeroes(off, length int64) error
}

// ErrReadOnly is returned by writes to a read-only backend.
var ErrReadOnly = errors.New("backend is read-only")

const (
	fallocKeepSize  = 0x01
	fallocPunchHole = 0x02
)

// FileBackend serves a regular file (or block device) with pread/pwrite.
type FileBackend struct {
	f        *os.File
	size     int64
	readOnly bool
}

// OpenFile opens path as a backend. With readOnly the file is opened O_RDONLY
// and writes fail with ErrReadOnly.
func OpenFile(path string, readOnly bool) (*FileBackend, error) {
	flag := os.O_RDWR
	if readOnly {
		flag = os.O_RDONLY
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return nil, fmt.Errorf("open backend %s: %w", path, err)
	}
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("size of backend %s: %w", path, err)
	}
	return &FileBackend{f: f, size: size, readOnly: readOnly}, nil
}

// ReadAt reads from the file; bytes past the end of a short file read as zeroes.
func (b *FileBackend) ReadAt(p []byte, off int64) (int, error) {
	n, err := b.f.ReadAt(p, off)
	if errors.Is(err, io.EOF) && off+int64(len(p)) <= b.size {
		clear(p[n:])
		return len(p), nil
	}
	return n, err
}

// WriteAt writes to the file.
func (b *FileBackend) WriteAt(p []byte, off int64) (int, error) {
	if b.readOnly {
		return 0, ErrReadOnly
	}
	return b.f.WriteAt(p, off)
}

// Size returns the size the file had when opened.
func (b *FileBackend) Size() int64 { return b.size }

// Flush fsyncs the file.
func (b *FileBackend) Flush() error {
	if b.readOnly {
		return nil
	}
	return b.f.Sync()
}

// Trim punches a hole, so trimmed ranges read as zeroes and free disk space.
func (b *FileBackend) Trim(off, length int64) error {
	if b.readOnly {
		return ErrReadOnly
	}
	err := syscall.Fallocate(int(b.f.Fd()), fallocPunchHole|fallocKeepSize, off, length)
	if errors.Is(err, syscall.EOPNOTSUPP) {
		return nil // trim is advisory; a file system without holes just keeps the data
	}
	return err
}

// WriteZeroes punches a hole where supported, otherwise writes zeroes.
func (b *FileBackend) WriteZeroes(off, length int64) error {
	if b.readOnly {
		return ErrReadOnly
	}
	err := syscall.Fallocate(int(b.f.Fd()), fallocPunchHole|fallocKeepSize, off, length)
	if err == nil {
		return nil
	}
	return writeZeroes(b, off, length)
}

// Close closes the file.
func (b *FileBackend) Close() error { return b.f.Close() }

// writeZeroes zero-fills a range with ordinary writes.
func writeZeroes(w io.WriterAt, off, length int64) error {
	zero := make([]byte, min(length, 1<<20))
	for length > 0 {
		n := min(length, int64(len(zero)))
		if _, err := w.WriteAt(zero[:n], off); err != nil {
			return err
		}
		off += n
		length -= n
	}
	return nil
}

// memChunk is the allocation unit of MemBackend.
const memChunk = 64 << 10

// MemBackend is a sparse in-memory disk: only written chunks use memory.
// It exists for tests and for scratch exports.
type MemBackend struct {
	mu     sync.RWMutex
	size   int64
	chunks map[int64][]byte
}

// NewMem returns an all-zero in-memory disk of the given size.
func NewMem(size int64) *MemBackend {
	return &MemBackend{size: size, chunks: make(map[int64][]byte)}
}

// ReadAt copies out of allocated chunks and zero-fills holes.
func (m *MemBackend) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > m.size {
		return 0, io.EOF
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	for done := 0; done < len(p); {
		pos := off + int64(done)
		idx, in := pos/memChunk, pos%memChunk
		n := min(len(p)-done, int(memChunk-in))
		if c, ok := m.chunks[idx]; ok {
			copy(p[done:done+n], c[in:])
		} else {
			clear(p[done : done+n])
		}
		done += n
	}
	return len(p), nil
}

// WriteAt copies into chunks, allocating them on first write.
func (m *MemBackend) WriteAt(p []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(p)) > m.size {
		return 0, fmt.Errorf("mem write at %d+%d: beyond size %d", off, len(p), m.size)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.chunks == nil {
		return 0, errors.New("mem write: backend closed")
	}
	for done := 0; done < len(p); {
		pos := off + int64(done)
		idx, in := pos/memChunk, pos%memChunk
		n := min(len(p)-done, int(memChunk-in))
		c, ok := m.chunks[idx]
		if !ok {
			c = make([]byte, memChunk)
			m.chunks[idx] = c
		}
		copy(c[in:], p[done:done+n])
		done += n
	}
	return len(p), nil
}

// Size returns the disk size.
func (m *MemBackend) Size() int64 { return m.size }

// Flush is a no-op: memory is as durable as it gets.
func (m *MemBackend) Flush() error { return nil }

// Trim zeroes the range and frees chunks it covers entirely.
func (m *MemBackend) Trim(off, length int64) error { return m.WriteZeroes(off, length) }

// WriteZeroes zeroes a range, dropping whole chunks.
func (m *MemBackend) WriteZeroes(off, length int64) error {
	if off < 0 || length < 0 || off+length > m.size {
		return fmt.Errorf("mem zero at %d+%d: beyond size %d", off, length, m.size)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for end := off + length; off < end; {
		idx, in := off/memChunk, off%memChunk
		n := min(end-off, memChunk-in)
		if n == memChunk {
			delete(m.chunks, idx)
		} else if c, ok := m.chunks[idx]; ok {
			clear(c[in : in+n])
		}
		off += n
	}
	return nil
}

// Allocated returns how many bytes of chunks are allocated (for tests of sparseness).
func (m *MemBackend) Allocated() int64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return int64(len(m.chunks)) * memChunk
}

// Close drops the contents.
func (m *MemBackend) Close() error {
	m.mu.Lock()
	m.chunks = nil
	m.mu.Unlock()
	return nil
}
