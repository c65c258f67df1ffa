package uring

import (
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// The kernel ABI (include/uapi/linux/io_uring.h).
const (
	sysIOUringSetup = 425
	sysIOUringEnter = 426

	setupClamp     = 1 << 4
	setupSubmitAll = 1 << 7
	enterGetEvents = 1 << 0

	offSQRing = 0
	offCQRing = 0x8000000
	offSQEs   = 0x10000000

	opReadv = 1
	opRead  = 22

	sqeSize = 64
	cqeSize = 16
)

type sqringOffsets struct {
	head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
	userAddr                                                        uint64
}

type cqringOffsets struct {
	head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
	userAddr                                                        uint64
}

type params struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFd uint32
	resv                                                                   [3]uint32
	sqOff                                                                  sqringOffsets
	cqOff                                                                  cqringOffsets
}

type sqe struct {
	opcode, flags         uint8
	ioprio                uint16
	fd                    int32
	off, addr             uint64
	len, rwFlags          uint32
	userData              uint64
	bufIndex, personality uint16
	spliceFdIn            int32
	addr3, pad            uint64
}

type cqe struct {
	userData uint64
	res      int32
	flags    uint32
}

// errRingBroken: the ring is in an unknown state and must not be reused.
var errRingBroken = errors.New("io_uring ring broken")

// ring is one io_uring instance, used by one goroutine at a time.
type ring struct {
	fd           int
	sq, cq, sqes []byte
	p            params
	sqHead       *uint32 // advanced by the kernel as it takes entries
	sqTail       *uint32
	sqMask       uint32
	sqArray      []uint32
	cqHead       *uint32
	cqTail       *uint32
	cqMask       uint32

	res    [ringEntries]int32
	iovecs []syscall.Iovec
}

func newRing(entries uint32) (*ring, error) {
	r := &ring{fd: -1}
	r.p.flags = setupClamp | setupSubmitAll
	fd, _, errno := syscall.Syscall(sysIOUringSetup, uintptr(entries), uintptr(unsafe.Pointer(&r.p)), 0)
	if errno == syscall.EINVAL { // kernels before 5.18 lack SUBMIT_ALL
		r.p = params{flags: setupClamp}
		fd, _, errno = syscall.Syscall(sysIOUringSetup, uintptr(entries), uintptr(unsafe.Pointer(&r.p)), 0)
	}
	if errno != 0 {
		return nil, fmt.Errorf("io_uring_setup: %w", errno)
	}
	r.fd = int(fd)
	live.Add(1)
	if err := r.mapRings(); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

func (r *ring) mapRings() error {
	var err error
	mmap := func(off int64, size uint32) []byte {
		if err != nil {
			return nil
		}
		var b []byte
		b, err = syscall.Mmap(r.fd, off, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED|syscall.MAP_POPULATE)
		return b
	}
	r.sq = mmap(offSQRing, r.p.sqOff.array+r.p.sqEntries*4)
	r.cq = mmap(offCQRing, r.p.cqOff.cqes+r.p.cqEntries*cqeSize)
	r.sqes = mmap(offSQEs, r.p.sqEntries*sqeSize)
	if err != nil {
		return fmt.Errorf("io_uring mmap: %w", err)
	}
	u32 := func(b []byte, off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&b[off])) }
	r.sqHead = u32(r.sq, r.p.sqOff.head)
	r.sqTail, r.sqMask = u32(r.sq, r.p.sqOff.tail), *u32(r.sq, r.p.sqOff.ringMask)
	r.cqHead, r.cqTail, r.cqMask = u32(r.cq, r.p.cqOff.head), u32(r.cq, r.p.cqOff.tail), *u32(r.cq, r.p.cqOff.ringMask)
	r.sqArray = unsafe.Slice(u32(r.sq, r.p.sqOff.array), r.p.sqEntries)
	return nil
}

func (r *ring) close() {
	for _, m := range [][]byte{r.sq, r.cq, r.sqes} {
		if m != nil {
			syscall.Munmap(m)
		}
	}
	r.sq, r.cq, r.sqes = nil, nil, nil
	if r.fd >= 0 {
		syscall.Close(r.fd)
		r.fd = -1
		live.Add(-1)
	}
}

// submitWait queues chunk (at most ringEntries ops), submits it and waits
// for every completion; r.res[i] is op i's result.
func (r *ring) submitWait(chunk []Op) error {
	n := 0
	for i := range chunk {
		if len(chunk[i].Iov) > 1 {
			n += len(chunk[i].Iov)
		}
	}
	if cap(r.iovecs) < n {
		r.iovecs = make([]syscall.Iovec, 0, n)
	}
	iov := r.iovecs[:0]
	tail := *r.sqTail // only this goroutine produces
	for i := range chunk {
		op := &chunk[i]
		s := sqe{opcode: opRead, fd: int32(op.Fd), off: uint64(op.Off), userData: uint64(i)}
		switch {
		case len(op.Iov) == 0: // reads nothing
		case len(op.Iov) == 1:
			s.addr, s.len = uint64(uintptr(unsafe.Pointer(unsafe.SliceData(op.Iov[0])))), uint32(len(op.Iov[0]))
		default:
			first := len(iov)
			for _, b := range op.Iov {
				v := syscall.Iovec{Base: unsafe.SliceData(b)}
				v.SetLen(len(b))
				iov = append(iov, v)
			}
			s.opcode, s.addr, s.len = opReadv, uint64(uintptr(unsafe.Pointer(&iov[first]))), uint32(len(op.Iov))
		}
		idx := (tail + uint32(i)) & r.sqMask
		*(*sqe)(unsafe.Pointer(&r.sqes[idx*sqeSize])) = s
		r.sqArray[idx] = idx
	}
	atomic.StoreUint32(r.sqTail, tail+uint32(len(chunk)))
	reaped, err := r.wait(len(chunk))
	if err != nil {
		// The kernel may still be reading into the caller's buffers (pooled:
		// they are reused as soon as we return) and into iov: wait until
		// every entry it took has completed before anyone may close the
		// ring or touch the buffers.
		r.drain(tail, reaped)
	}
	clear(iov) // drop the pointers into the caller's buffers
	r.iovecs = iov[:0]
	return err
}

// drain waits for the completion of every entry the kernel took from the
// submission queue since tail (reaped of them are already reaped). It only
// polls the completion ring, which the kernel fills however io_uring_enter
// fails, so it works on a ring that is otherwise broken.
func (r *ring) drain(tail uint32, reaped int) {
	taken := int(atomic.LoadUint32(r.sqHead) - tail)
	for pause := time.Microsecond; reaped < taken; pause = min(2*pause, 10*time.Millisecond) {
		if n := r.reap(); n > 0 {
			reaped += n
			continue
		}
		time.Sleep(pause)
	}
}

// enterHook replaces io_uring_enter in tests (nil: the system call).
var enterHook func(r *ring, toSubmit, minComplete int) (int, syscall.Errno)

func (r *ring) enter(toSubmit, minComplete int) (int, syscall.Errno) {
	if enterHook != nil {
		return enterHook(r, toSubmit, minComplete)
	}
	ret, _, errno := syscall.Syscall6(sysIOUringEnter, uintptr(r.fd), uintptr(toSubmit), uintptr(minComplete), enterGetEvents, 0, 0)
	return int(ret), errno
}

// wait submits the queued n entries and reaps n completions; it returns how
// many it reaped.
func (r *ring) wait(n int) (int, error) {
	submitted, reaped, stalls := 0, 0, 0
	for reaped < n {
		ret, errno := r.enter(n-submitted, n-reaped)
		switch errno {
		case 0:
			submitted += ret
		case syscall.EINTR: // Go's preemption signal; nothing was submitted
		case syscall.EAGAIN, syscall.EBUSY:
			if stalls++; stalls > 1000 {
				return reaped + r.reap(), fmt.Errorf("%w: io_uring_enter: %v", errRingBroken, errno)
			}
		default:
			return reaped + r.reap(), fmt.Errorf("%w: io_uring_enter: %v", errRingBroken, errno)
		}
		reaped += r.reap()
	}
	return reaped, nil
}

func (r *ring) reap() int {
	head := *r.cqHead
	tail := atomic.LoadUint32(r.cqTail)
	n := 0
	for ; head != tail; head++ {
		c := (*cqe)(unsafe.Pointer(&r.cq[r.p.cqOff.cqes+(head&r.cqMask)*cqeSize]))
		if c.userData < ringEntries {
			r.res[c.userData] = c.res
		}
		n++
	}
	atomic.StoreUint32(r.cqHead, head)
	return n
}
