package lsmt

import (
	"fmt"
	"io"
	"sync"

	"github.com/agentenv/agentenv/internal/uring"
)

// The read path. A request that a stack serves from one piece is one read of
// one layer file. A larger request usually maps to many pieces from a few
// layer files, and on a virtual machine every system call is dear, so the
// pieces are gathered into as few reads as possible:
//
//   - Pieces of one layer whose data lie back to back in the layer file (a
//     sealed layer packs its data in logical order, so a layer's consecutive
//     segments usually do) are read with one vectored read, each piece landing
//     at its own place in the caller's buffer.
//   - For the layer with the most pieces in the request (typically the base
//     image, cut into pieces by newer layers), when it is read with system
//     calls rather than copied from a mapping, pieces separated by a hole of
//     the same size in the file and in the request are read with one read
//     through the hole. The hole's bytes in the buffer are garbage at that
//     point; they belong to pieces of other layers, zeroed pieces or unmapped
//     ranges, which are all written after it. So the result is the same as
//     resolving every byte top-down, whatever the hole holds.

// maxOverRead bounds one hole read through: a hole costs a copy of its
// bytes, a separate read costs a system call and a page-cache lookup (about
// 4 us measured on our 2-core VMs, the time to copy some 64 KiB).
const maxOverRead = 64 << 10

// maxIovecs is the kernel's IOV_MAX.
const maxIovecs = 1024

// vectorReaderAt reads the contiguous range at off into bufs in order
// (storage/blob's files implement it with preadv).
type vectorReaderAt interface {
	ReadvAt(bufs [][]byte, off int64) (int, error)
}

// memorySource is a source whose small reads are copies from memory (a
// mapped file) rather than system calls: reading through holes there would
// only add bytes to copy, so its pieces are read as they are.
type memorySource interface {
	CopiesSmallReads() bool
}

func throughHoles(src io.ReaderAt) bool {
	m, ok := src.(memorySource)
	return !ok || !m.CopiesSmallReads()
}

type readScratch struct {
	next  []int32 // index of the next data piece of the same layer, or -1
	done  []bool  // data piece already read
	iov   [][]byte
	ops   []uring.Op
	opAt  []int32 // where each op's buffers start in iov
	opTag []uint8 // each op's layer
	held  []batchSource
}

var scratchPool = sync.Pool{New: func() any { return new(readScratch) }}

// piece is a clipped segment in bytes: p[a-off:b-off] holds the layer's
// bytes at pos (for data segments).
func piece(s Segment, off, end int64) (a, b, pos int64) {
	a = max(int64(s.Offset)*SectorSize, off)
	b = min(int64(s.End())*SectorSize, end)
	pos = int64(s.MOffset)*SectorSize + (a - int64(s.Offset)*SectorSize)
	return a, b, pos
}

// readSegments fills p with the logical bytes at off given the clipped,
// ordered segments that map into it: data pieces from srcs[tag], zeroed
// pieces as zeros, and gaps through gap (zeros if nil).
func readSegments(p []byte, off int64, segs []Segment, srcs []io.ReaderAt, gap func([]byte, int64) error) error {
	data := 0
	for i := range segs {
		if !segs[i].Zeroed {
			data++
		}
	}
	if data <= 1 {
		return readEach(p, off, segs, srcs, gap)
	}
	sc := scratchPool.Get().(*readScratch)
	err := sc.readBatched(p, off, segs, srcs, gap)
	if err == errNoBatch {
		err = sc.read(p, off, segs, srcs, gap)
	}
	clear(sc.iov) // do not keep the caller's buffer alive
	sc.iov = sc.iov[:0]
	scratchPool.Put(sc)
	return err
}

// readEach serves every piece with its own read: the path of small requests.
func readEach(p []byte, off int64, segs []Segment, srcs []io.ReaderAt, gap func([]byte, int64) error) error {
	end := off + int64(len(p))
	cur := off
	for _, s := range segs {
		a, b, pos := piece(s, off, end)
		if a > cur {
			if err := fillGap(p[cur-off:a-off], cur, gap); err != nil {
				return err
			}
		}
		q := p[a-off : b-off]
		if s.Zeroed {
			clear(q)
		} else if err := readFull(srcs[s.Tag], q, pos); err != nil {
			return err
		}
		cur = b
	}
	if cur < end {
		return fillGap(p[cur-off:], cur, gap)
	}
	return nil
}

// link links each data piece to the next one of the same layer (walking
// backwards, last[tag] is the layer's first piece + 1) and counts pieces
// per layer.
func (sc *readScratch) link(segs []Segment, last *[MaxLayers + 1]int32, count *[MaxLayers + 1]uint16) {
	n := len(segs)
	if cap(sc.next) < n {
		sc.next = make([]int32, n)
		sc.done = make([]bool, n)
	}
	sc.next, sc.done = sc.next[:n], sc.done[:n]
	clear(sc.done)
	for i := n - 1; i >= 0; i-- {
		s := segs[i]
		if s.Zeroed {
			continue
		}
		sc.next[i] = last[s.Tag] - 1
		last[s.Tag] = int32(i) + 1
		count[s.Tag]++
	}
}

func (sc *readScratch) read(p []byte, off int64, segs []Segment, srcs []io.ReaderAt, gap func([]byte, int64) error) error {
	end := off + int64(len(p))
	var last [MaxLayers + 1]int32
	var count [MaxLayers + 1]uint16
	sc.link(segs, &last, &count)
	best := -1
	for t, c := range count[:len(srcs)] {
		if c >= 2 && (best < 0 || c > count[best]) && throughHoles(srcs[t]) {
			best = t
		}
	}
	if best >= 0 {
		if err := sc.readLayer(p, off, end, segs, srcs[best], int(last[best])-1, true); err != nil {
			return err
		}
	}
	return sc.fillRest(p, off, segs, srcs, gap)
}

// fillRest reads the data pieces not done yet and fills zeroed pieces and
// gaps.
func (sc *readScratch) fillRest(p []byte, off int64, segs []Segment, srcs []io.ReaderAt, gap func([]byte, int64) error) error {
	end := off + int64(len(p))
	cur := off
	for i, s := range segs {
		a, b, _ := piece(s, off, end)
		if a > cur {
			if err := fillGap(p[cur-off:a-off], cur, gap); err != nil {
				return err
			}
		}
		cur = b
		switch {
		case s.Zeroed:
			clear(p[a-off : b-off])
		case !sc.done[i]:
			if err := sc.readLayer(p, off, end, segs, srcs[s.Tag], i, false); err != nil {
				return err
			}
		}
	}
	if cur < end {
		return fillGap(p[cur-off:], cur, gap)
	}
	return nil
}

// readLayer reads the data pieces of one layer starting at piece i, in runs
// of pieces that are contiguous in the layer file (and, with holes, through
// holes of equal size in file and request), until the first piece that does
// not continue the run, or (with holes) through all of the layer's pieces.
func (sc *readScratch) readLayer(p []byte, off, end int64, segs []Segment, src io.ReaderAt, i int, holes bool) error {
	iov := sc.iov[:0]
	var start, runEnd, lastB, lastA int64 // file range of the run; request range of the last iovec
	flush := func() error {
		err := readRun(src, iov, start)
		clear(iov)
		iov = iov[:0]
		return err
	}
	for ; i >= 0; i = int(sc.next[i]) {
		a, b, pos := piece(segs[i], off, end)
		if len(iov) > 0 && len(iov) < maxIovecs {
			if pos == runEnd {
				iov = append(iov, p[a-off:b-off])
				lastA, lastB, runEnd = a, b, runEnd+(b-a)
				sc.done[i] = true
				continue
			}
			if h := pos - runEnd; holes && h > 0 && h <= maxOverRead && a-lastB == h {
				iov[len(iov)-1] = p[lastA-off : b-off]
				lastB, runEnd = b, pos+(b-a)
				sc.done[i] = true
				continue
			}
			if !holes {
				break
			}
		}
		if len(iov) > 0 {
			if err := flush(); err != nil {
				return err
			}
		}
		iov = append(iov, p[a-off:b-off])
		start, runEnd, lastA, lastB = pos, pos+(b-a), a, b
		sc.done[i] = true
	}
	err := flush()
	sc.iov = iov
	return err
}

// readRun reads the contiguous file range at pos into bufs in order.
func readRun(src io.ReaderAt, bufs [][]byte, pos int64) error {
	switch len(bufs) {
	case 0:
		return nil
	case 1:
		return readFull(src, bufs[0], pos)
	}
	if v, ok := src.(vectorReaderAt); ok {
		total := 0
		for _, q := range bufs {
			total += len(q)
		}
		n, err := v.ReadvAt(bufs, pos)
		if n == total {
			return nil
		}
		if err == nil || err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("read %d bytes at offset %d: %w", total, pos, err)
	}
	for _, q := range bufs {
		if err := readFull(src, q, pos); err != nil {
			return err
		}
		pos += int64(len(q))
	}
	return nil
}

func fillGap(q []byte, off int64, gap func([]byte, int64) error) error {
	if gap == nil {
		clear(q)
		return nil
	}
	return gap(q, off)
}
