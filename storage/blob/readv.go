package blob

import (
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"
	"unsafe"
)

// VectorReaderAt reads one contiguous range of a source into several
// buffers in order (the range at off fills bufs[0], then bufs[1], ...). A
// layer stack uses it to serve the pieces of one request that lie next to
// each other in a layer file with one system call, where each piece lands
// at its own place in the caller's buffer.
type VectorReaderAt interface {
	ReadvAt(bufs [][]byte, off int64) (int, error)
}

// maxIovecs is the kernel's IOV_MAX.
const maxIovecs = 1024

var iovPool = sync.Pool{New: func() any { s := make([]syscall.Iovec, 0, 64); return &s }}

// preadv fills bufs from f at off with preadv(2), retrying short reads
// (signals) until the range is read or the file ends (io.EOF).
func preadv(f *os.File, bufs [][]byte, off int64) (int, error) {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("read blob %s: %w", f.Name(), err)
	}
	total := 0
	for len(bufs) > 0 {
		chunk := bufs[:min(len(bufs), maxIovecs)]
		want := 0
		for _, b := range chunk {
			want += len(b)
		}
		n, err := preadvOnce(rc, chunk, off)
		total += n
		off += int64(n)
		if err != nil {
			return total, fmt.Errorf("read blob %s at %d: %w", f.Name(), off, err)
		}
		if n == 0 && want > 0 {
			return total, io.EOF
		}
		bufs = advance(bufs, n)
	}
	return total, nil
}

// advance drops the first n bytes from bufs (in place on the slice headers).
func advance(bufs [][]byte, n int) [][]byte {
	for len(bufs) > 0 && n >= len(bufs[0]) {
		n -= len(bufs[0])
		bufs = bufs[1:]
	}
	if len(bufs) > 0 && n > 0 {
		bufs[0] = bufs[0][n:]
	}
	return bufs
}

func preadvOnce(rc syscall.RawConn, bufs [][]byte, off int64) (int, error) {
	ip := iovPool.Get().(*[]syscall.Iovec)
	iov := (*ip)[:0]
	for _, b := range bufs {
		if len(b) == 0 {
			continue
		}
		v := syscall.Iovec{Base: &b[0]}
		v.SetLen(len(b))
		iov = append(iov, v)
	}
	var n uintptr
	var errno syscall.Errno
	if len(iov) > 0 {
		// The fd lock of RawConn.Read keeps the descriptor from being
		// closed (and its number reused) during the call.
		rerr := rc.Read(func(fd uintptr) bool {
			for {
				n, _, errno = syscall.Syscall6(syscall.SYS_PREADV, fd, uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)),
					uintptr(off), uintptr(uint64(off)>>32), 0)
				if errno != syscall.EINTR {
					return true
				}
			}
		})
		if rerr != nil {
			errno = 0
			clear(iov)
			*ip = iov[:0]
			iovPool.Put(ip)
			return 0, rerr
		}
	}
	clear(iov) // drop the pointers into the caller's buffers
	*ip = iov[:0]
	iovPool.Put(ip)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// ReadvAt reads [off, off+sum(len(bufs))) into bufs with preadv(2).
func (b *File) ReadvAt(bufs [][]byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("read blob %s: negative offset", b.f.Name())
	}
	return preadv(b.f, bufs, off)
}

// ReadvAt copies from the mapping when the range is small and preads when
// it is large, as ReadAt does.
func (b *Mapped) ReadvAt(bufs [][]byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("read blob %s: negative offset", b.f.Name())
	}
	total := 0
	for _, p := range bufs {
		total += len(p)
	}
	if total >= preadThreshold {
		return preadv(b.f, bufs, off)
	}
	done := 0
	for _, p := range bufs {
		n, err := b.ReadAt(p, off+int64(done))
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// CopiesSmallReads tells the layer stack that reads below 64 KiB are copies
// from the mapping, not system calls (so gathering them saves nothing).
func (b *Mapped) CopiesSmallReads() bool { return true }
