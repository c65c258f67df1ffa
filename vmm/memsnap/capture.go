package memsnap

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
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

// CaptureDiff writes the pages that process pid wrote into its PRIVATE mapping
// of memFile (the guest RAM of a VMM restored from a memory image mapped
// copy-on-write) as a sealed LSMT layer at out, whose parent UUID is
// parentUUID and whose virtual size is the mapping size (precisely: the
// mapping's end in the file, or the file's size if that is larger, so that
// stacking the diff never cuts off the parent). Logical offsets in the layer
// are file offsets; VMMs map guest RAM from offset 0.
//
// The caller has stopped the vCPUs (and any device emulation that writes guest
// memory). Written pages are the mapping's anonymous pages: pagemap entries
// present or swapped with the file-page bit clear. An all-zero written page is
// recorded as a zeroed extent, so it hides the parent's data. The layer is
// written to out+".tmp" and renamed.
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
	region, err := FindRegion(pid, memFile)
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
	af, err := createAtomic(out)
	if err != nil {
		return Stats{}, err
	}
	vs := region.FileOffset + region.Size()
	if fi, err := os.Stat(memFile); err == nil && fi.Size() > int64(vs) {
		vs = uint64(fi.Size()+lsmt.SectorSize-1) / lsmt.SectorSize * lsmt.SectorSize
	}
	xw, err := lsmt.NewExtentWriter(af, lsmt.SealOptions{VirtualSize: vs, Parent: parent, Message: message})
	if err != nil {
		af.abort()
		return Stats{}, err
	}
	c := &capturer{pid: pid, region: region, pm: pm, xw: xw, buf: make([]byte, readBatch)}
	if err := c.run(ctx); err != nil {
		af.abort()
		return c.stats, err
	}
	res, err := xw.Close()
	if err != nil {
		af.abort()
		return c.stats, err
	}
	if err := af.commit(); err != nil {
		return c.stats, err
	}
	c.stats.Bytes = res.FileSize
	return c.stats, nil
}

// capturer streams the written pages of one region into a layer: pagemap in
// batches, runs of written pages gathered into one process_vm_readv per
// batch, each page then written as data or as a zeroed extent.
type capturer struct {
	pid    int
	region Region
	pm     *os.File
	xw     *lsmt.ExtentWriter
	stats  Stats

	buf    []byte             // gathered page contents
	used   int                // bytes of buf in use
	remote []unix.RemoteIovec // the runs in buf, in address order
	offs   []uint64           // logical (file) offset of each run
}

func (c *capturer) run(ctx context.Context) error {
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
	return c.flush()
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
// flushing whenever the buffer or the iovec list is full.
func (c *capturer) addRun(p, npages uint64) error {
	ps := uint64(pageSize)
	for npages > 0 {
		room := uint64(len(c.buf)-c.used) / ps
		if room == 0 || len(c.remote) == maxIovecs {
			if err := c.flush(); err != nil {
				return err
			}
			continue
		}
		k := min(room, npages)
		c.remote = append(c.remote, unix.RemoteIovec{Base: uintptr(c.region.Start + p*ps), Len: int(k * ps)})
		c.offs = append(c.offs, c.region.FileOffset+p*ps)
		c.used += int(k * ps)
		p, npages = p+k, npages-k
	}
	return nil
}

// flush reads the queued runs from the process and writes them to the layer.
func (c *capturer) flush() error {
	if len(c.remote) == 0 {
		return nil
	}
	if err := readRemote(c.pid, c.buf[:c.used], c.remote); err != nil {
		return err
	}
	pos := 0
	for i, r := range c.remote {
		if err := c.emit(int64(c.offs[i]), c.buf[pos:pos+r.Len]); err != nil {
			return err
		}
		pos += r.Len
	}
	c.remote, c.offs, c.used = c.remote[:0], c.offs[:0], 0
	return nil
}

// emit writes the pages of b (at logical offset off): runs of non-zero pages
// as data, runs of zero pages as zeroed extents.
func (c *capturer) emit(off int64, b []byte) error {
	for i := 0; i < len(b); {
		zero := isZero(b[i : i+pageSize])
		j := i + pageSize
		for j < len(b) && isZero(b[j:j+pageSize]) == zero {
			j += pageSize
		}
		n := int64((j - i) / pageSize)
		if zero {
			if err := c.xw.WriteZeroed(off+int64(i), int64(j-i)); err != nil {
				return err
			}
			c.stats.ZeroPages += n
		} else {
			if err := c.xw.WriteData(off+int64(i), b[i:j]); err != nil {
				return err
			}
			c.stats.Pages += n
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
