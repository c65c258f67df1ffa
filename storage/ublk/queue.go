//go:build linux

package ublk

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// queue serves one hardware queue of a device: depth tags, each with its
// own buffer, fetched and committed as URING_CMDs on the char device from
// one OS thread (the driver binds a queue to the thread that fetched).
type queue struct {
	id      uint16
	depth   int
	charFd  int
	descs   []byte // the driver's ublksrv_io_desc array for this queue (read only)
	bufs    []byte // depth * maxIO bytes outside the Go heap
	maxIO   int
	backend Backend
	log     *slog.Logger
}

// completion is a request the backend has handled.
type completion struct {
	tag    uint16
	result int32
}

func (q *queue) desc(tag uint16) ioDesc {
	return *(*ioDesc)(unsafe.Pointer(&q.descs[int(tag)*int(unsafe.Sizeof(ioDesc{}))]))
}

func (q *queue) buf(tag uint16) []byte {
	return q.bufs[int(tag)*q.maxIO : (int(tag)+1)*q.maxIO]
}

// run fetches every tag, reports on fetched, then serves requests until
// the driver aborts every tag (the device stopped or is being removed).
func (q *queue) run(fetched chan<- error) error {
	runtime.LockOSThread() // never unlocked: the thread goes with the goroutine
	r, err := newRing(uint32(q.depth))
	if err != nil {
		fetched <- err
		return err
	}
	defer r.close()
	for tag := range q.depth {
		q.queue(r, ioFetchReq, uint16(tag), -1)
	}
	if err := r.enter(0); err != nil {
		fetched <- err
		return err
	}
	fetched <- nil
	active := q.depth
	var ready []uint16
	for active > 0 {
		if err := r.enter(1); err != nil {
			return fmt.Errorf("ublk queue %d: %w", q.id, err)
		}
		ready = ready[:0]
		r.reap(func(ud uint64, res int32) {
			switch res {
			case ioResOK:
				ready = append(ready, uint16(ud))
			case ioResAbort:
				active--
			default:
				q.log.Warn("ublk: fetch failed", "queue", q.id, "tag", ud, "err", unix.Errno(-res))
				active--
			}
		})
		for _, c := range q.serve(ready) {
			q.queue(r, ioCommitAndFetchReq, c.tag, c.result)
		}
	}
	return nil
}

func (q *queue) queue(r *ring, op uint32, tag uint16, result int32) {
	c := ioCmd{queueID: q.id, tag: tag, result: result, addr: uint64(uintptr(unsafe.Pointer(&q.buf(tag)[0])))}
	if !r.queueCmd(q.charFd, op, uint64(tag), unsafe.Slice((*byte)(unsafe.Pointer(&c)), unsafe.Sizeof(c))) {
		// The ring has one entry per tag and each tag has one command
		// outstanding at most, so this cannot happen.
		panic("ublk: submission queue overflow")
	}
}

// serve handles the ready requests, concurrently when there are several
// (a queue depth above one is only worth something if the backend sees it).
func (q *queue) serve(tags []uint16) []completion {
	out := make([]completion, len(tags))
	if len(tags) == 1 {
		out[0] = completion{tags[0], q.handle(tags[0])}
		return out
	}
	var wg sync.WaitGroup
	for i, tag := range tags {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = completion{tag, q.handle(tag)}
		}()
	}
	wg.Wait()
	return out
}

// handle performs one request; the result is the byte count for reads and
// writes, 0 for the others, or a negative errno.
func (q *queue) handle(tag uint16) int32 {
	d := q.desc(tag)
	off, n := int64(d.startSector)<<9, int64(d.nrSectors)<<9
	var err error
	switch op := d.opFlags & 0xff; op {
	case opRead:
		if n > int64(q.maxIO) {
			return -int32(unix.EINVAL)
		}
		var got int
		got, err = q.backend.ReadAt(q.buf(tag)[:n], off)
		if errors.Is(err, io.EOF) && int64(got) == n {
			err = nil
		}
	case opWrite:
		if n > int64(q.maxIO) {
			return -int32(unix.EINVAL)
		}
		_, err = q.backend.WriteAt(q.buf(tag)[:n], off)
	case opFlush:
		return result(q, "flush", 0, q.backend.Flush())
	case opDiscard:
		return result(q, "discard", 0, q.backend.Trim(off, n))
	case opWriteZeroes:
		if z, ok := q.backend.(Zeroer); ok {
			return result(q, "write-zeroes", 0, z.WriteZeroes(off, n))
		}
		return result(q, "write-zeroes", 0, q.backend.Trim(off, n))
	default:
		return -int32(unix.EOPNOTSUPP)
	}
	return result(q, "read/write", int32(n), err)
}

func result(q *queue, what string, ok int32, err error) int32 {
	if err == nil {
		return ok
	}
	q.log.Warn("ublk: request failed", "queue", q.id, "op", what, "err", err)
	var en unix.Errno
	if errors.As(err, &en) {
		return -int32(en)
	}
	return -int32(unix.EIO)
}
