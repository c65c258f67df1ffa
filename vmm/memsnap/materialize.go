package memsnap

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/agentenv/agentenv/internal/atomicfile"

	"github.com/agentenv/agentenv/storage/lsmt"
)

// Materialize flattens a stack of sealed memory layers (bottom to top) into a
// sparse raw file at out, written atomically (internal/atomicfile), so a crash
// never leaves a half file under the final name. The size is the top layer's
// virtual size. Only non-zero data is written: unmapped ranges, zeroed
// extents and zero pages inside data extents stay holes.
func Materialize(ctx context.Context, layers []string, out string) error {
	start := time.Now()
	n, err := materialize(ctx, layers, out)
	if err != nil {
		return fmt.Errorf("materialize %d memory layers into %s: %w", len(layers), out, err)
	}
	slog.Debug("memsnap: materialized memory layers", "layers", len(layers), "out", out, "data_bytes", n, "took", time.Since(start))
	return nil
}

func materialize(ctx context.Context, paths []string, out string) (int64, error) {
	st, err := openStack(paths)
	if err != nil {
		return 0, err
	}
	defer st.Close()
	af, err := atomicfile.Create(out, 0o600) // guest memory: private to its owner
	if err != nil {
		return 0, err
	}
	written, err := copyStack(ctx, st, af, false)
	if err == nil {
		err = af.Truncate(st.Size())
	}
	if err != nil {
		af.Abort()
		return written, err
	}
	return written, af.Commit()
}

// copyStack writes the data segments of the stack's merged index to f at
// their logical offsets, skipping zero pages, and returns the bytes written.
// With onto set, f already holds data (the stack's parent image): zeroed
// segments and zero pages are then zeroed in f, as holes where possible.
//
// It works in windows of the virtual disk. A diff's pages interleave with
// its base's, so a window holds thousands of small pieces; reading each
// layer's pieces of a window with one read of their physical span (layers
// are packed in logical order) and writing each contiguous run once keeps
// the system calls per window to a few.
func copyStack(ctx context.Context, st *lsmt.Stack, f *atomicfile.File, onto bool) (int64, error) {
	var written int64
	err := eachWindow(ctx, st, make([]byte, readBatch), func(w *window, segs []lsmt.Segment, w0, w1 int64) error {
		n, err := w.emit(f, segs, w0, w1, onto)
		written += n
		return err
	})
	return written, err
}

// eachWindow walks the stack's logical range in windows of len(buf) bytes:
// for each window with any segment, it reads the data pieces into buf
// (window.fill) and hands the window's merged segments to fn.
func eachWindow(ctx context.Context, st *lsmt.Stack, buf []byte, fn func(w *window, segs []lsmt.Segment, w0, w1 int64) error) error {
	return claimWindows(ctx, st, &window{lowers: st.Lowers(), size: int64(len(buf)), buf: buf}, new(atomic.Int64), fn)
}

// claimWindows is eachWindow over the windows it claims from next (window
// indexes, taken in order): walkers that share next split the stack's
// windows between them, each window going to exactly one. When w maps the
// layers, nothing is read into a buffer (window.data reads the mappings).
func claimWindows(ctx context.Context, st *lsmt.Stack, w *window, next *atomic.Int64, fn func(w *window, segs []lsmt.Segment, w0, w1 int64) error) error {
	size := st.Size()
	var segs []lsmt.Segment
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		w0 := (next.Add(1) - 1) * w.size
		if w0 >= size {
			return nil
		}
		w1 := min(w0+w.size, size)
		s0 := uint64(w0) / lsmt.SectorSize
		segs = st.MergedIndex().Lookup(segs[:0], s0, (uint64(w1)+lsmt.SectorSize-1)/lsmt.SectorSize-s0)
		if len(segs) == 0 {
			continue
		}
		if w.maps == nil {
			if err := w.fill(segs, w0, w1); err != nil {
				return err
			}
		}
		if err := fn(w, segs, w0, w1); err != nil {
			return err
		}
	}
}

// window is the logical range [w0, w0+size) of a stack being copied.
type window struct {
	lowers  []*lsmt.Layer
	size    int64
	buf     []byte   // logical bytes of the window (only data pieces are filled)
	scratch []byte   // one layer's physical span
	maps    [][]byte // when set, each layer's bytes mapped (by tag), read in place
}

// data is the bytes of the data piece s, [a, b) in the window at w0.
func (w *window) data(s lsmt.Segment, a, b, w0 int64) ([]byte, error) {
	if w.maps == nil {
		return w.buf[a-w0 : b-w0], nil
	}
	m := w.maps[s.Tag]
	p := int64(s.MOffset) * lsmt.SectorSize
	if p+b-a > int64(len(m)) {
		return nil, fmt.Errorf("layer %s: data at %d+%d is past its end (%d)", w.lowers[s.Tag].Name(), p, b-a, len(m))
	}
	return m[p : p+b-a], nil
}

// maxSpanTags bounds how many layers' spans are read per window; past it
// (a window touched by very many layers) pieces are read one by one.
const maxSpanTags = 16

// fill reads the data pieces of segs (the window's merged segments, clipped
// to it) into buf.
func (w *window) fill(segs []lsmt.Segment, w0, w1 int64) error {
	var lo, hi [256]int64
	var seen [256]bool
	var tags []uint8
	for _, s := range segs {
		if s.Zeroed {
			continue
		}
		a, b := pieceSpan(s, w1)
		if a >= b {
			continue
		}
		p0 := int64(s.MOffset) * lsmt.SectorSize
		p1 := p0 + b - a
		if !seen[s.Tag] {
			seen[s.Tag], lo[s.Tag], hi[s.Tag] = true, p0, p1
			tags = append(tags, s.Tag)
		}
		lo[s.Tag], hi[s.Tag] = min(lo[s.Tag], p0), max(hi[s.Tag], p1)
	}
	for _, tag := range tags {
		l := w.lowers[tag]
		span := hi[tag] - lo[tag]
		if len(tags) > maxSpanTags || span > 2*int64(len(w.buf)) {
			if err := w.fillPieces(segs, tag, w0, w1); err != nil {
				return err
			}
			continue
		}
		if int64(cap(w.scratch)) < span {
			w.scratch = make([]byte, span)
		}
		sc := w.scratch[:span]
		if err := readAt(l, sc, lo[tag]); err != nil {
			return err
		}
		for _, s := range segs {
			if s.Zeroed || s.Tag != tag {
				continue
			}
			a, b := pieceSpan(s, w1)
			p0 := int64(s.MOffset)*lsmt.SectorSize - lo[tag]
			copy(w.buf[a-w0:b-w0], sc[p0:p0+b-a])
		}
	}
	return nil
}

// fillPieces reads the data pieces of layer tag one by one.
func (w *window) fillPieces(segs []lsmt.Segment, tag uint8, w0, w1 int64) error {
	for _, s := range segs {
		if s.Zeroed || s.Tag != tag {
			continue
		}
		a, b := pieceSpan(s, w1)
		if a >= b {
			continue
		}
		if err := readAt(w.lowers[tag], w.buf[a-w0:b-w0], int64(s.MOffset)*lsmt.SectorSize); err != nil {
			return err
		}
	}
	return nil
}

// emit writes the window: contiguous data pieces as one run each (zero
// pages skipped, or zeroed in f when onto), zeroed pieces zeroed in f when onto.
func (w *window) emit(f *atomicfile.File, segs []lsmt.Segment, w0, w1 int64, onto bool) (int64, error) {
	var written int64
	runA, runB := int64(-1), int64(-1)
	flush := func() error {
		if runA < 0 {
			return nil
		}
		n, err := writeNonZero(f, w.buf[runA-w0:runB-w0], runA, onto)
		written += n
		runA, runB = -1, -1
		return err
	}
	for _, s := range segs {
		a, b := pieceSpan(s, w1)
		if a >= b {
			continue
		}
		if s.Zeroed {
			if !onto {
				continue
			}
			if err := flush(); err != nil {
				return written, err
			}
			if err := zeroRange(f.File, a, b-a); err != nil {
				return written, err
			}
			continue
		}
		if runA >= 0 && a != runB {
			if err := flush(); err != nil {
				return written, err
			}
		}
		if runA < 0 {
			runA = a
		}
		runB = b
	}
	return written, flush()
}

// pieceSpan is the logical byte range of a (window-clipped) segment, cut at
// the end of the stack.
func pieceSpan(s lsmt.Segment, end int64) (int64, int64) {
	return int64(s.Offset) * lsmt.SectorSize, min(int64(s.End())*lsmt.SectorSize, end)
}

func readAt(l *lsmt.Layer, p []byte, off int64) error {
	if n, err := l.DataReaderAt().ReadAt(p, off); n < len(p) {
		return fmt.Errorf("read layer %s at %d: got %d of %d bytes: %w", l.Name(), off, n, len(p), err)
	}
	return nil
}

// writeNonZero writes the parts of b (at off) that are not whole zero pages
// (page boundaries taken in the output file), so zero pages stay holes. With
// punch set, the zero pieces are also zeroed in f (which may hold data there).
func writeNonZero(f *atomicfile.File, b []byte, off int64, punch bool) (int64, error) {
	ps := int64(pageSize)
	var written int64
	pieceEnd := func(p int64) int64 { return min((off+p)/ps*ps+ps-off, int64(len(b))) }
	for p := int64(0); p < int64(len(b)); {
		q := pieceEnd(p)
		zero := isZero(b[p:q])
		for q < int64(len(b)) && isZero(b[q:pieceEnd(q)]) == zero {
			q = pieceEnd(q)
		}
		switch {
		case zero && punch:
			if err := zeroRange(f.File, off+p, q-p); err != nil {
				return written, err
			}
		case !zero:
			if _, err := f.WriteAt(b[p:q], off+p); err != nil {
				return written, fmt.Errorf("write at %d: %w", off+p, err)
			}
			written += q - p
		}
		p = q
	}
	return written, nil
}
