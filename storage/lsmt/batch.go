package lsmt

import (
	"errors"
	"fmt"
	"io"

	"github.com/agentenv/agentenv/internal/uring"
)

// Batched reads. When every layer a request touches is a local file
// (storage/blob), its pieces are read with one io_uring submission: each
// run of pieces that lie back to back in one layer file is one vectored
// read, and all the runs of all the layers go to the kernel together. This
// reads no byte twice (no reading through holes) and costs one system call
// per request however fragmented the stack is. Where io_uring is not
// available the plain path (read) serves the request.

// batchSource is a layer source whose descriptor can be lent to a batch
// (storage/blob's local files).
type batchSource interface {
	AcquireFd() (int, bool)
	ReleaseFd()
}

// errNoBatch: serve the request the plain way.
var errNoBatch = errors.New("no batch")

func (sc *readScratch) readBatched(p []byte, off int64, segs []Segment, srcs []io.ReaderAt, gap func([]byte, int64) error) error {
	if !uring.Enabled() {
		return errNoBatch
	}
	var last [MaxLayers + 1]int32
	var count [MaxLayers + 1]uint16
	for _, s := range segs {
		if !s.Zeroed {
			if _, ok := srcs[s.Tag].(batchSource); !ok {
				return errNoBatch
			}
		}
	}
	sc.link(segs, &last, &count)
	err := sc.batchPieces(p, off, segs, srcs, &last)
	for _, b := range sc.held {
		b.ReleaseFd()
	}
	clear(sc.held)
	sc.held = sc.held[:0]
	clear(sc.ops)
	sc.ops = sc.ops[:0]
	if err != nil {
		return err
	}
	return sc.fillRest(p, off, segs, srcs, gap)
}

// batchPieces reads every data piece of the request: runs of small pieces
// of mapped layers by copying, all others in one batch.
func (sc *readScratch) batchPieces(p []byte, off int64, segs []Segment, srcs []io.ReaderAt, last *[MaxLayers + 1]int32) error {
	end := off + int64(len(p))
	sc.opAt, sc.opTag = sc.opAt[:0], sc.opTag[:0]
	for tag := range srcs {
		if last[tag] == 0 {
			continue
		}
		src := srcs[tag].(batchSource)
		fd, ok := src.AcquireFd()
		if !ok {
			return fmt.Errorf("read layer %d: closed", tag)
		}
		sc.held = append(sc.held, src)
		copies := !throughHoles(srcs[tag])
		for i := int(last[tag]) - 1; i >= 0; {
			first := len(sc.iov)
			var start, runEnd int64
			total := 0
			for ; i >= 0 && len(sc.iov)-first < maxIovecs; i = int(sc.next[i]) {
				a, b, pos := piece(segs[i], off, end)
				if len(sc.iov) > first && pos != runEnd {
					break
				}
				if len(sc.iov) == first {
					start, runEnd = pos, pos
				}
				sc.iov = append(sc.iov, p[a-off:b-off])
				runEnd += b - a
				total += int(b - a)
				sc.done[i] = true
			}
			if copies && total < mappedCopyLimit {
				err := readRun(srcs[tag], sc.iov[first:], start)
				clear(sc.iov[first:])
				sc.iov = sc.iov[:first]
				if err != nil {
					return err
				}
				continue
			}
			sc.ops = append(sc.ops, uring.Op{Fd: fd, Off: start})
			sc.opAt = append(sc.opAt, int32(first))
			sc.opTag = append(sc.opTag, uint8(tag))
		}
	}
	for k := range sc.ops { // iov is final now: hand out the buffers
		e := len(sc.iov)
		if k+1 < len(sc.ops) {
			e = int(sc.opAt[k+1])
		}
		sc.ops[k].Iov = sc.iov[sc.opAt[k]:e]
	}
	if len(sc.ops) == 1 {
		// One run: a plain (p)readv costs less than a ring round trip
		// (measured: a 4 KiB random read of one piece was 150 ns dearer).
		return readRun(srcs[sc.opTag[0]], sc.ops[0].Iov, sc.ops[0].Off)
	}
	err := uring.ReadBatch(sc.ops)
	if errors.Is(err, uring.ErrUnavailable) { // every ring busy: read the runs one by one
		for k, op := range sc.ops {
			if err := readRun(srcs[sc.opTag[k]], op.Iov, op.Off); err != nil {
				return err
			}
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %d pieces from %d layers: %w", len(sc.iov), len(sc.held), err)
	}
	return nil
}

// mappedCopyLimit: runs of a mapped layer below it are copied from the
// mapping (storage/blob reads smaller ranges that way).
const mappedCopyLimit = 64 << 10
