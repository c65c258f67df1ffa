package memsnap

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/storage/lsmt"
)

// pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst).
const (
	pmPresent = 1 << 63
	pmSwapped = 1 << 62
	pmFile    = 1 << 61 // file page or shared anonymous page
	pmGuard   = 1 << 58 // guard region marker (MADV_GUARD_INSTALL, Linux 6.15+): reported as swapped, holds nothing
)

// written reports whether a pagemap entry of a private file mapping is a page
// the process wrote: an anonymous (copy-on-write) page, in RAM or in swap.
func written(e uint64) bool {
	return e&(pmPresent|pmSwapped) != 0 && e&(pmFile|pmGuard) == 0
}

const (
	pagemapBatch = 16 << 10 // pages per pagemap read (128 KiB of entries)
	readBatch    = 4 << 20  // bytes per process_vm_readv batch
	maxIovecs    = 1024     // UIO_MAXIOV: remote iovecs per process_vm_readv call
)

// CaptureDiff writes the pages that process pid wrote into its PRIVATE
// mapping of memFile (the guest RAM of a VMM restored from a memory image
// mapped copy-on-write) as a sealed LSMT layer at out, whose parent UUID is
// parentUUID and whose virtual size is the mapping size. Precisely: every
// private mapping of memFile is captured when they cover disjoint parts of
// the file (see FindRegions), logical offsets in the layer are file offsets
// (VMMs map guest RAM from offset 0), and the virtual size is the end of the
// last mapping in the file, or the file's size if that is larger, so that
// stacking the diff never cuts off its parent.
//
// The caller has stopped the vCPUs (and any device emulation that writes
// guest memory). Written pages are the mapping's anonymous pages: pagemap
// entries present or swapped with the file-page bit clear. An all-zero
// written page is recorded as a zeroed extent, so it hides the parent's
// data. The diff is relative to memFile: a VM that goes on running after a
// capture keeps its anonymous pages, so its next diff is again a diff
// against memFile (a superset of this one), not against this layer. The
// layer is written atomically (internal/atomicfile).
func CaptureDiff(ctx context.Context, pid int, memFile, out string, parentUUID lsmt.UUID, message string) (Stats, error) {
	start := time.Now()
	st, err := captureDiff(ctx, pid, memFile, out, parentUUID, message)
	if err != nil {
		return st, fmt.Errorf("capture memory diff of pid %d (%s) into %s: %w", pid, memFile, out, err)
	}
	st.Took = time.Since(start)
	slog.Debug("memsnap: captured memory diff", "pid", pid, "out", out, "pages", st.Pages,
		"zero_pages", st.ZeroPages, "bytes", st.Bytes, "took", st.Took)
	return st, nil
}

func captureDiff(ctx context.Context, pid int, memFile, out string, parent lsmt.UUID, message string) (Stats, error) {
	regions, err := FindRegions(pid, memFile)
	if err != nil {
		return Stats{}, err
	}
	pm, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return Stats{}, ErrProcessGone
		}
		return Stats{}, err
	}
	defer pm.Close()
	last := regions[len(regions)-1]
	vs := last.FileOffset + last.Size()
	if fi, err := os.Stat(memFile); err == nil && fi.Size() > int64(vs) {
		vs = uint64(fi.Size()+lsmt.SectorSize-1) / lsmt.SectorSize * lsmt.SectorSize
	}
	var st Stats
	err = writeLayer(out, lsmt.SealOptions{VirtualSize: vs, Parent: parent, Message: message}, &st,
		func(xw *lsmt.ExtentWriter) error { return capture(ctx, pid, regions, pm, xw, &st) })
	return st, err
}

// batch is a set of runs of written pages read with one process_vm_readv.
type batch struct {
	buf    []byte             // the pages' contents
	used   int                // bytes of buf in use
	remote []unix.RemoteIovec // the runs, in address order
	offs   []uint64           // logical (file) offset of each run
}

// batchPool keeps batch buffers between captures: a pause every few
// seconds should not clear 8 MiB of fresh buffers each time.
var batchPool = sync.Pool{New: func() any { return &batch{buf: make([]byte, readBatch)} }}

// capture streams the written pages of regions (in file order) into xw. Two batches
// alternate: while one is written to the layer (zero detection, the file
// write), the next is gathered from pagemap and read from the process, so
// the copy out of the VMM overlaps the write.
func capture(ctx context.Context, pid int, regions []Region, pm *os.File, xw *lsmt.ExtentWriter, st *Stats) error {
	c := &capturer{pid: pid, pm: pm,
		free: make(chan *batch, 2), full: make(chan *batch), werr: make(chan error, 1)}
	for range 2 {
		b := batchPool.Get().(*batch)
		b.used, b.remote, b.offs = 0, b.remote[:0], b.offs[:0] // a failed capture may have left it dirty
		defer batchPool.Put(b)                                 // after the writer is done: capture waits for it below
		c.free <- b
	}
	go c.writer(xw, st)
	var err error
	for _, r := range regions {
		if err = c.run(ctx, r); err != nil {
			break
		}
	}
	if err == nil {
		err = c.flush()
	}
	close(c.full)
	werr := <-c.werr // after this, st is the writer's final count
	if werr != nil {
		return werr
	}
	return err
}

// capturer is the reading side of a capture.
type capturer struct {
	pid    int
	region Region // the one being scanned
	pm     *os.File
	cur    *batch      // being gathered; nil until a free one is taken
	free   chan *batch // batches the writer is done with
	full   chan *batch // batches read from the process, for the writer
	werr   chan error  // the writer's result, once full is closed
	failed atomic.Bool // the writer failed: stop reading
}

// errWriterFailed stops the reader; the writer's own error is reported.
var errWriterFailed = errors.New("layer writer failed")

// run queues the written pages of one region (the batches are flushed by
// the caller at the end).
func (c *capturer) run(ctx context.Context, r Region) error {
	c.region = r
	pages := c.region.Size() / uint64(pageSize)
	raw := make([]byte, 8*min(pages, pagemapBatch))
	for first := uint64(0); first < pages; first += pagemapBatch {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := min(pages-first, pagemapBatch)
		ents := raw[:8*n]
		addr := c.region.Start + first*uint64(pageSize)
		if err := c.readPagemap(ents, addr); err != nil {
			return err
		}
		for i := uint64(0); i < n; {
			if !written(binary.LittleEndian.Uint64(ents[8*i:])) {
				i++
				continue
			}
			j := i + 1
			for j < n && written(binary.LittleEndian.Uint64(ents[8*j:])) {
				j++
			}
			if err := c.addRun(first+i, j-i); err != nil {
				return err
			}
			i = j
		}
	}
	return nil
}

func (c *capturer) readPagemap(ents []byte, addr uint64) error {
	off := int64(addr / uint64(pageSize) * 8)
	n, err := c.pm.ReadAt(ents, off)
	if n == len(ents) {
		return nil
	}
	if err == nil || errors.Is(err, unix.ESRCH) || n == 0 {
		// The process exited or unmapped the region under us.
		return fmt.Errorf("read pagemap at %#x: got %d of %d bytes (%v): %w", addr, n, len(ents), err, ErrProcessGone)
	}
	return fmt.Errorf("read pagemap at %#x: %w", addr, err)
}

// addRun queues npages written pages starting at page index p of the region,
// flushing whenever the batch's buffer or iovec list is full.
func (c *capturer) addRun(p, npages uint64) error {
	ps := uint64(pageSize)
	for npages > 0 {
		if c.cur == nil {
			c.cur = <-c.free
		}
		b := c.cur
		room := uint64(len(b.buf)-b.used) / ps
		if room == 0 || len(b.remote) == maxIovecs {
			if err := c.flush(); err != nil {
				return err
			}
			continue
		}
		k := min(room, npages)
		b.remote = append(b.remote, unix.RemoteIovec{Base: uintptr(c.region.Start + p*ps), Len: int(k * ps)})
		b.offs = append(b.offs, c.region.FileOffset+p*ps)
		b.used += int(k * ps)
		p, npages = p+k, npages-k
	}
	return nil
}

// flush reads the current batch from the process and hands it to the writer.
func (c *capturer) flush() error {
	b := c.cur
	if b == nil || len(b.remote) == 0 {
		return nil
	}
	if c.failed.Load() {
		return errWriterFailed
	}
	if err := readRemote(c.pid, b.buf[:b.used], b.remote); err != nil {
		return err
	}
	c.cur = nil
	c.full <- b
	return nil
}

// writer writes every batch it is handed to xw, counting pages in st, and
// gives the batch back. After a failure it only drains.
func (c *capturer) writer(xw *lsmt.ExtentWriter, st *Stats) {
	var err error
	for b := range c.full {
		if err == nil {
			pos := 0
			for i, r := range b.remote {
				if err = emit(xw, st, int64(b.offs[i]), b.buf[pos:pos+r.Len]); err != nil {
					c.failed.Store(true)
					break
				}
				pos += r.Len
			}
		}
		b.used, b.remote, b.offs = 0, b.remote[:0], b.offs[:0]
		c.free <- b
	}
	c.werr <- err
}

// emit writes the pages of b (at logical offset off): runs of non-zero pages
// as data, runs of zero pages as zeroed extents.
func emit(xw *lsmt.ExtentWriter, st *Stats, off int64, b []byte) error {
	for i := 0; i < len(b); {
		zero := isZero(b[i : i+pageSize])
		j := i + pageSize
		for j < len(b) && isZero(b[j:j+pageSize]) == zero {
			j += pageSize
		}
		n := int64((j - i) / pageSize)
		if zero {
			if err := xw.WriteZeroed(off+int64(i), int64(j-i)); err != nil {
				return err
			}
			st.ZeroPages += n
		} else {
			if err := xw.WriteData(off+int64(i), b[i:j]); err != nil {
				return err
			}
			st.Pages += n
		}
		i = j
	}
	return nil
}

// readRemote fills buf from the remote ranges (whose lengths sum to len(buf)),
// continuing after partial transfers.
func readRemote(pid int, buf []byte, remote []unix.RemoteIovec) error {
	remote = append([]unix.RemoteIovec(nil), remote...) // advanced in place below
	for done := 0; done < len(buf); {
		local := []unix.Iovec{{Base: &buf[done]}}
		local[0].SetLen(len(buf) - done)
		n, err := unix.ProcessVMReadv(pid, local, remote, 0)
		if errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("process_vm_readv: %w", ErrProcessGone)
		}
		if err != nil {
			return fmt.Errorf("process_vm_readv at %#x: %w", remote[0].Base, err)
		}
		if n <= 0 {
			return fmt.Errorf("process_vm_readv at %#x: no progress", remote[0].Base)
		}
		done += n
		for n > 0 {
			if n >= remote[0].Len {
				n -= remote[0].Len
				remote = remote[1:]
				continue
			}
			remote[0].Base += uintptr(n)
			remote[0].Len -= n
			n = 0
		}
	}
	return nil
}
