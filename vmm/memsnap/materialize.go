package memsnap

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/agentenv/agentenv/storage/lsmt"
)

// Materialize flattens a stack of sealed memory layers (bottom to top) into a
// sparse raw file at out, written to out+".tmp" then renamed, so a crash
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
	af, err := createAtomic(out)
	if err != nil {
		return 0, err
	}
	written, err := copyStack(ctx, st, af, false)
	if err == nil {
		err = af.Truncate(st.Size())
	}
	if err != nil {
		af.abort()
		return written, err
	}
	return written, af.commit()
}

// copyStack writes the data segments of the stack's merged index to f at
// their logical offsets, skipping zero pages, and returns the bytes written.
// With onto set, f already holds data (the stack's parent image): zeroed
// segments and zero pages are then zeroed in f, as holes where possible.
// Logically contiguous segments (a diff's pages between its base's) are
// gathered into one buffer and written with one call.
func copyStack(ctx context.Context, st *lsmt.Stack, f *atomicFile, onto bool) (int64, error) {
	size := st.Size()
	lowers := st.Lowers()
	w := &gather{f: f, buf: make([]byte, readBatch), punch: onto}
	for i, s := range st.MergedIndex().Segments() {
		if i%256 == 0 {
			if err := ctx.Err(); err != nil {
				return w.written, err
			}
		}
		a := int64(s.Offset) * lsmt.SectorSize
		b := min(int64(s.End())*lsmt.SectorSize, size)
		if a >= b {
			continue
		}
		if s.Zeroed {
			if onto {
				if err := w.flush(); err != nil {
					return w.written, err
				}
				if err := zeroRange(f.File, a, b-a); err != nil {
					return w.written, err
				}
			}
			continue
		}
		l := lowers[s.Tag]
		if err := w.add(l, int64(s.MOffset)*lsmt.SectorSize, a, b-a); err != nil {
			return w.written, err
		}
	}
	return w.written, w.flush()
}

// gather collects logically contiguous data in buf before writing it.
type gather struct {
	f       *atomicFile
	buf     []byte
	start   int64 // logical offset of buf[0]
	n       int64 // bytes of buf in use
	punch   bool  // zero pages must be zeroed in f (it is not empty)
	written int64
}

// add appends length bytes read from layer l at physical offset phys, which
// belong at logical offset logical.
func (g *gather) add(l *lsmt.Layer, phys, logical, length int64) error {
	for length > 0 {
		if g.n > 0 && (logical != g.start+g.n || g.n == int64(len(g.buf))) {
			if err := g.flush(); err != nil {
				return err
			}
		}
		if g.n == 0 {
			g.start = logical
		}
		k := min(length, int64(len(g.buf))-g.n)
		chunk := g.buf[g.n : g.n+k]
		if n, err := l.DataReaderAt().ReadAt(chunk, phys); n < len(chunk) {
			return fmt.Errorf("read layer %s at %d: got %d of %d bytes: %w", l.Name(), phys, n, len(chunk), err)
		}
		g.n += k
		phys, logical, length = phys+k, logical+k, length-k
	}
	return nil
}

func (g *gather) flush() error {
	if g.n == 0 {
		return nil
	}
	w, err := writeNonZero(g.f, g.buf[:g.n], g.start, g.punch)
	g.written += w
	g.n = 0
	return err
}

// writeNonZero writes the parts of b (at off) that are not whole zero pages
// (page boundaries taken in the output file), so zero pages stay holes. With
// punch set, the zero pieces are also zeroed in f (which may hold data there).
func writeNonZero(f *atomicFile, b []byte, off int64, punch bool) (int64, error) {
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
