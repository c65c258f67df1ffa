// Package uring submits batches of file reads through Linux io_uring: the
// pieces of one read of a layer stack, spread over several layer files, go
// to the kernel in one system call instead of one each. Reads of cached
// files complete inline during that call, so a batch costs one user/kernel
// round trip (dear on virtual machines) however many pieces it has.
//
// Only what the read path needs is here: IORING_OP_READ and IORING_OP_READV
// on regular files, a small pool of rings, and a fallback signal
// (ErrUnavailable) when the kernel refuses io_uring (old kernels, seccomp,
// kernel.io_uring_disabled), so callers keep their plain read path.
package uring

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
)

// ErrUnavailable means no ring could be had: io_uring is disabled or not
// supported here, or every ring of the pool is in use. Read the plain way.
var ErrUnavailable = errors.New("io_uring unavailable")

// Op is one read of a batch: the contiguous range at Off of the file open
// as Fd fills the buffers of Iov in order.
type Op struct {
	Fd  int
	Iov [][]byte
	Off int64
}

func (o *Op) size() int {
	n := 0
	for _, b := range o.Iov {
		n += len(b)
	}
	return n
}

var (
	disabled  atomic.Bool // set by SetEnabled(false) or when setup failed
	setupOnce sync.Once
	live      atomic.Int32 // rings in existence
	free      = make(chan *ring, 64)
)

// ringEntries bounds the ops submitted at once; larger batches go in chunks.
const ringEntries = 64

// SetEnabled turns batching on or off for the process (benchmarks compare
// both paths; AENV_IO_URING=off turns it off from the start).
func SetEnabled(on bool) { disabled.Store(!on) }

// Enabled reports whether ReadBatch may use io_uring.
func Enabled() bool {
	setupOnce.Do(func() {
		if v := os.Getenv("AENV_IO_URING"); v == "off" || v == "0" || v == "false" {
			disabled.Store(true)
			return
		}
		r, err := newRing(ringEntries)
		if err != nil {
			disabled.Store(true)
			return
		}
		put(r)
	})
	return !disabled.Load()
}

func get() *ring {
	select {
	case r := <-free:
		return r
	default:
	}
	if int(live.Load()) >= 4*runtime.GOMAXPROCS(0)+4 {
		return nil
	}
	r, err := newRing(ringEntries)
	if err != nil {
		return nil
	}
	return r
}

func put(r *ring) {
	select {
	case free <- r:
	default:
		r.close()
	}
}

// ReadBatch performs every op, each reading its whole range (a range past
// the end of its file is an error wrapping io.ErrUnexpectedEOF). The caller
// keeps the descriptors open until it returns. It returns ErrUnavailable,
// having read nothing, when io_uring cannot be used; the caller then reads
// the plain way.
func ReadBatch(ops []Op) error {
	if len(ops) == 0 {
		return nil
	}
	if !Enabled() {
		return ErrUnavailable
	}
	r := get()
	if r == nil {
		return ErrUnavailable
	}
	err := r.run(ops)
	if errors.Is(err, errRingBroken) {
		r.close()
		return err
	}
	put(r)
	return err
}

// run submits ops in chunks the ring holds and checks every completion.
func (r *ring) run(ops []Op) error {
	for len(ops) > 0 {
		chunk := ops[:min(len(ops), ringEntries)]
		if err := r.submitWait(chunk); err != nil {
			return err
		}
		for i := range chunk {
			if err := finish(&chunk[i], r.res[i]); err != nil {
				return err
			}
		}
		ops = ops[len(chunk):]
	}
	return nil
}

// finish checks one completion; a short read (a signal, or the end of the
// file) is completed or diagnosed with plain reads.
func finish(op *Op, res int32) error {
	if res < 0 {
		return fmt.Errorf("read fd %d at %d: %w", op.Fd, op.Off, syscall.Errno(-res))
	}
	want := op.size()
	if int(res) == want {
		return nil
	}
	done := int(res)
	off := op.Off + int64(done)
	for _, b := range op.Iov {
		if done >= len(b) {
			done -= len(b)
			continue
		}
		b = b[done:]
		done = 0
		if err := preadFull(op.Fd, b, off); err != nil {
			return fmt.Errorf("read fd %d: %d bytes at %d: %w", op.Fd, want, op.Off, err)
		}
		off += int64(len(b))
	}
	return nil
}

func preadFull(fd int, b []byte, off int64) error {
	for len(b) > 0 {
		n, err := syscall.Pread(fd, b, off)
		switch {
		case err == syscall.EINTR:
			continue
		case err != nil:
			return err
		case n == 0:
			return io.ErrUnexpectedEOF
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}
