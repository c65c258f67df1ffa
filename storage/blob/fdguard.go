package blob

import (
	"runtime"
	"sync/atomic"
)

// fdGuard keeps a file's descriptor valid while reads submitted outside
// the os.File use its number (a layer stack's io_uring batches): Close waits
// until they are done, so the kernel cannot hand the number to another file
// in the middle of a batch.
type fdGuard struct{ state atomic.Int64 } // in-flight users, plus guardClosed

const guardClosed = 1 << 62

func (g *fdGuard) acquire() bool {
	for {
		s := g.state.Load()
		if s&guardClosed != 0 {
			return false
		}
		if g.state.CompareAndSwap(s, s+1) {
			return true
		}
	}
}

func (g *fdGuard) release() { g.state.Add(-1) }

// closeWait refuses new users and waits for the current ones (a batch is a
// few microseconds of reads).
func (g *fdGuard) closeWait() {
	for {
		s := g.state.Load()
		if g.state.CompareAndSwap(s, s|guardClosed) {
			break
		}
	}
	for g.state.Load() != guardClosed {
		runtime.Gosched()
	}
}

// AcquireFd returns the file's descriptor for reads made outside the
// os.File, valid until ReleaseFd; false once the blob is closing.
func (b *File) AcquireFd() (int, bool) {
	if !b.guard.acquire() {
		return -1, false
	}
	return b.fd, true
}

// ReleaseFd ends a use begun by AcquireFd.
func (b *File) ReleaseFd() { b.guard.release() }

// AcquireFd returns the mapped file's descriptor, as File.AcquireFd.
func (b *Mapped) AcquireFd() (int, bool) {
	if !b.guard.acquire() {
		return -1, false
	}
	return b.fd, true
}

// ReleaseFd ends a use begun by AcquireFd.
func (b *Mapped) ReleaseFd() { b.guard.release() }
