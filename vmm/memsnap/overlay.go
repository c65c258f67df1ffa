package memsnap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/storage/lsmt"
)

// WriteLayers writes the memory that sealed layers (bottom to top) hold on
// top of memFile into process pid's private mapping of memFile, so that
// the mapping reads as the flattened stack of memFile and the layers. It
// is the restore-side counterpart of CaptureDiff: instead of flattening a
// stack into a new file for a VM to map (Materialize, a copy of all guest
// RAM), a VMM maps the stack's bottom file and gets only the layers' pages
// written into its copy-on-write mapping, before the guest runs.
//
// Data pages are written; zeroed extents (and zero pages) are written as
// zeros only where memFile holds data, since a hole already reads as zero.
// Every page that differs from memFile is then one of the process's own
// (anonymous) pages, so a later CaptureDiff against memFile captures them
// all again, with whatever the guest wrote since: stacked on these layers
// it gives the guest's memory. The caller has stopped the process's
// threads that use the mapping (a VMM that has not started its guest).
func WriteLayers(ctx context.Context, pid int, memFile string, layers []string) (Stats, error) {
	start := time.Now()
	st, err := writeLayers(ctx, pid, memFile, layers)
	st.Took = time.Since(start)
	if err != nil {
		return st, fmt.Errorf("write %d memory layers into pid %d's mapping of %s: %w", len(layers), pid, memFile, err)
	}
	slog.Debug("memsnap: wrote memory layers into a mapping", "pid", pid, "layers", len(layers),
		"pages", st.Pages, "zero_pages", st.ZeroPages, "took", st.Took)
	return st, nil
}

// writeWorkers is how many threads write into the process at once. The
// kernel takes each written page's copy-on-write fault (a new page, and a
// copy of the file's page into it that the write then overwrites) in the
// writing thread, most of the cost, and process_vm_writev holds the
// target's mm lock for read only, so threads writing disjoint windows fault
// in parallel. The target's vCPUs have not started yet: two threads use a
// two-core machine whole; a third gained nothing there. With one CPU to
// run on (GOMAXPROCS follows the cgroup's limit) one thread does.
const writeWorkers = 2

func writeLayers(ctx context.Context, pid int, memFile string, paths []string) (Stats, error) {
	regions, err := FindRegions(pid, memFile)
	if err != nil {
		return Stats{}, err
	}
	stack, err := openStack(paths)
	if err != nil {
		return Stats{}, err
	}
	defer stack.Close()
	base, err := os.Open(memFile)
	if err != nil {
		return Stats{}, err
	}
	defer base.Close()
	maps, unmap := mapLayers(stack.Lowers())
	defer unmap()
	return writeParallel(ctx, min(writeWorkers, runtime.GOMAXPROCS(0)), func(ctx context.Context, next *atomic.Int64, st *Stats) error {
		w := &window{lowers: stack.Lowers(), size: readBatch, maps: maps}
		if maps == nil {
			w.buf = make([]byte, readBatch)
		}
		rw := &remoteWriter{pid: pid, regions: regions}
		return claimWindows(ctx, stack, w, next, func(w *window, segs []lsmt.Segment, w0, w1 int64) error {
			return rw.window(base, w, segs, w0, w1, st)
		})
	})
}

// writeParallel runs n workers that claim windows from one counter, each
// counting into its own Stats, waits for all of them and returns the sum.
// The first worker to fail stops the others; its error is the result.
func writeParallel(ctx context.Context, n int, work func(ctx context.Context, next *atomic.Int64, st *Stats) error) (Stats, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		next     atomic.Int64
		wg       sync.WaitGroup
		once     sync.Once
		firstErr error
	)
	stats := make([]Stats, n)
	for i := range n {
		wg.Go(func() {
			if err := work(ctx, &next, &stats[i]); err != nil {
				once.Do(func() { firstErr = err })
				cancel()
			}
		})
	}
	wg.Wait()
	var sum Stats
	for _, st := range stats {
		sum.Pages += st.Pages
		sum.ZeroPages += st.ZeroPages
		sum.Bytes += st.Bytes
	}
	return sum, firstErr
}

// mapLayers maps the layers' files read-only, so their data goes into the
// process straight from the page cache: reading it into a buffer first
// cost a tenth of the time and a second pass over the bytes. It returns
// nil (read the layers into buffers) when a layer is not a plain file (a
// ZFile is read through its decompressor) or cannot be mapped.
func mapLayers(lowers []*lsmt.Layer) ([][]byte, func()) {
	var maps [][]byte
	unmap := func() {
		for _, m := range maps {
			unix.Munmap(m)
		}
	}
	for _, l := range lowers {
		f, ok := l.DataReaderAt().(*os.File)
		if !ok || l.Compressed {
			unmap()
			return nil, func() {}
		}
		m, err := unix.Mmap(int(f.Fd()), 0, int(l.FileSize()), unix.PROT_READ, unix.MAP_SHARED)
		if err != nil {
			slog.Debug("memsnap: cannot map a memory layer, reading it", "layer", l.Name(), "err", err)
			unmap()
			return nil, func() {}
		}
		maps = append(maps, m)
	}
	return maps, unmap
}

// remoteWriter batches writes into another process's mapping of a file.
type remoteWriter struct {
	pid     int
	regions []Region
	local   []unix.Iovec
	remote  []unix.RemoteIovec
}

// zeros is the source of zero writes (read only).
var zeros = make([]byte, readBatch)

// window writes the pieces of one window and flushes them: the window's
// buffer (when the layers are read, not mapped) is reused by the next one.
func (rw *remoteWriter) window(base *os.File, w *window, segs []lsmt.Segment, w0, w1 int64, st *Stats) error {
	for _, s := range segs {
		a, b := pieceSpan(s, w1)
		if a >= b {
			continue
		}
		if s.Zeroed {
			if err := rw.zeroed(base, a, b-a, st); err != nil {
				return err
			}
			continue
		}
		p, err := w.data(s, a, b, w0)
		if err != nil {
			return err
		}
		st.Pages += (b - a + psz() - 1) / psz()
		st.Bytes += b - a
		if err := rw.add(p, a); err != nil {
			return err
		}
	}
	return rw.flush()
}

// zeroed queues zeros for n bytes at file offset off when the base file
// holds data there.
func (rw *remoteWriter) zeroed(base *os.File, off, n int64, st *Stats) error {
	if !hasData(base, off, n) {
		return nil
	}
	st.ZeroPages += (n + psz() - 1) / psz()
	for done := int64(0); done < n; done += int64(len(zeros)) {
		if err := rw.add(zeros[:min(int64(len(zeros)), n-done)], off+done); err != nil {
			return err
		}
	}
	return nil
}

// hasData reports whether f may hold data in [off, off+n) (errors say yes:
// writing zeros is always correct, only not always needed).
func hasData(f *os.File, off, n int64) bool {
	d, err := unix.Seek(int(f.Fd()), off, unix.SEEK_DATA)
	if errors.Is(err, unix.ENXIO) {
		return false
	}
	return err != nil || d < off+n
}

// add queues b for file offset off, split where the mapping's regions are.
func (rw *remoteWriter) add(b []byte, off int64) error {
	for len(b) > 0 {
		r, ok := rw.regionAt(uint64(off))
		if !ok {
			return fmt.Errorf("offset %#x is outside the process's mapping", off)
		}
		n := min(uint64(len(b)), r.FileOffset+r.Size()-uint64(off))
		rw.local = append(rw.local, unix.Iovec{Base: &b[0]})
		rw.local[len(rw.local)-1].SetLen(int(n))
		rw.remote = append(rw.remote, unix.RemoteIovec{Base: uintptr(r.Start + uint64(off) - r.FileOffset), Len: int(n)})
		if len(rw.local) == maxIovecs {
			if err := rw.flush(); err != nil {
				return err
			}
		}
		b, off = b[n:], off+int64(n)
	}
	return nil
}

func (rw *remoteWriter) regionAt(off uint64) (Region, bool) {
	for _, r := range rw.regions {
		if off >= r.FileOffset && off < r.FileOffset+r.Size() {
			return r, true
		}
	}
	return Region{}, false
}

// flush writes the queued pieces, continuing after partial transfers
// (local and remote pieces pair up one to one, of equal lengths).
func (rw *remoteWriter) flush() error {
	local, remote := rw.local, rw.remote
	rw.local, rw.remote = rw.local[:0], rw.remote[:0]
	for len(remote) > 0 {
		n, err := unix.ProcessVMWritev(rw.pid, local, remote, 0)
		if errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("process_vm_writev: %w", ErrProcessGone)
		}
		if err != nil {
			return fmt.Errorf("process_vm_writev at %#x: %w", remote[0].Base, err)
		}
		if n <= 0 {
			return fmt.Errorf("process_vm_writev at %#x: no progress", remote[0].Base)
		}
		for n > 0 {
			if n >= remote[0].Len {
				n -= remote[0].Len
				local, remote = local[1:], remote[1:]
				continue
			}
			local[0].Base = (*byte)(unsafe.Add(unsafe.Pointer(local[0].Base), n))
			local[0].SetLen(int(local[0].Len) - n)
			remote[0].Base += uintptr(n)
			remote[0].Len -= n
			n = 0
		}
	}
	return nil
}
