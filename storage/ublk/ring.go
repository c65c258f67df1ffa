//go:build linux

package ublk

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ring is an io_uring with 128-byte submission entries, which URING_CMD
// needs for ublk's command payloads. It is ublk's own rather than
// internal/uring's: that package pools 64-byte rings for batches of file
// reads, while a ublk queue keeps one ring on one OS thread for the life of
// the device with commands that stay in the kernel until I/O arrives.
// A ring is used by one goroutine at a time.
type ring struct {
	fd             int
	sq, cq, sqes   []byte
	p              uringParams
	sqHead, sqTail *uint32
	sqMask         uint32
	sqArray        []uint32
	cqHead, cqTail *uint32
	cqMask         uint32
	queued         uint32 // entries written since the last enter
}

const (
	setupSQE128   = 1 << 10
	enterGetEvent = 1 << 0
	opURingCmd    = 46
	sqeSize       = 128
	cqeSize       = 16

	offSQRing = 0
	offCQRing = 0x8000000
	offSQEs   = 0x10000000
)

type uringParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFd uint32
	resv                                                                   [3]uint32
	sqOff                                                                  [10]uint32 // head tail mask entries flags dropped array resv1 user_addr(2)
	cqOff                                                                  [10]uint32 // head tail mask entries overflow cqes flags resv1 user_addr(2)
}

type cqe struct {
	userData uint64
	res      int32
	flags    uint32
}

func newRing(entries uint32) (*ring, error) {
	r := &ring{fd: -1}
	r.p.flags = setupSQE128
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, uintptr(entries), uintptr(unsafe.Pointer(&r.p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup (SQE128): %w", errno)
	}
	r.fd = int(fd)
	mmap := func(off int64, size uint32) ([]byte, error) {
		return unix.Mmap(r.fd, off, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	}
	var err error
	if r.sq, err = mmap(offSQRing, r.p.sqOff[6]+r.p.sqEntries*4); err == nil {
		if r.cq, err = mmap(offCQRing, r.p.cqOff[5]+r.p.cqEntries*cqeSize); err == nil {
			r.sqes, err = mmap(offSQEs, r.p.sqEntries*sqeSize)
		}
	}
	if err != nil {
		r.close()
		return nil, fmt.Errorf("io_uring mmap: %w", err)
	}
	u32 := func(b []byte, off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&b[off])) }
	r.sqHead, r.sqTail, r.sqMask = u32(r.sq, r.p.sqOff[0]), u32(r.sq, r.p.sqOff[1]), *u32(r.sq, r.p.sqOff[2])
	r.sqArray = unsafe.Slice(u32(r.sq, r.p.sqOff[6]), r.p.sqEntries)
	r.cqHead, r.cqTail, r.cqMask = u32(r.cq, r.p.cqOff[0]), u32(r.cq, r.p.cqOff[1]), *u32(r.cq, r.p.cqOff[2])
	return r, nil
}

func (r *ring) close() {
	for _, m := range [][]byte{r.sq, r.cq, r.sqes} {
		if m != nil {
			unix.Munmap(m)
		}
	}
	r.sq, r.cq, r.sqes = nil, nil, nil
	if r.fd >= 0 {
		unix.Close(r.fd)
		r.fd = -1
	}
}

// queueCmd writes one URING_CMD entry: cmdOp on fd with payload copied into
// the entry's command area (offset 48, 80 bytes with SQE128). It reports
// false when the submission queue is full.
func (r *ring) queueCmd(fd int, cmdOp uint32, userData uint64, payload []byte) bool {
	tail := *r.sqTail + r.queued
	if tail-atomic.LoadUint32(r.sqHead) >= r.p.sqEntries {
		return false
	}
	idx := tail & r.sqMask
	e := r.sqes[idx*sqeSize : (idx+1)*sqeSize]
	clear(e)
	e[0] = opURingCmd
	*(*int32)(unsafe.Pointer(&e[4])) = int32(fd)
	*(*uint32)(unsafe.Pointer(&e[8])) = cmdOp
	*(*uint64)(unsafe.Pointer(&e[32])) = userData
	copy(e[48:], payload)
	r.sqArray[idx] = idx
	r.queued++
	return true
}

// enter publishes the queued entries, submits every entry the kernel has
// not taken yet and waits for at least minComplete completions.
func (r *ring) enter(minComplete int) error {
	if r.queued > 0 {
		atomic.StoreUint32(r.sqTail, *r.sqTail+r.queued)
		r.queued = 0
	}
	for {
		toSubmit := *r.sqTail - atomic.LoadUint32(r.sqHead)
		_, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), uintptr(toSubmit), uintptr(minComplete), enterGetEvent, 0, 0)
		switch errno {
		case 0:
			return nil
		case unix.EINTR: // Go's preemption signal
			continue
		default:
			return fmt.Errorf("io_uring_enter: %w", errno)
		}
	}
}

// reap calls fn for each completion and frees them.
func (r *ring) reap(fn func(userData uint64, res int32)) int {
	head, tail := *r.cqHead, atomic.LoadUint32(r.cqTail)
	n := 0
	for ; head != tail; head++ {
		c := (*cqe)(unsafe.Pointer(&r.cq[r.p.cqOff[5]+(head&r.cqMask)*cqeSize]))
		fn(c.userData, c.res)
		n++
	}
	atomic.StoreUint32(r.cqHead, head)
	return n
}
