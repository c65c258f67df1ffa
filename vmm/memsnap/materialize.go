package memsnap

import (
	"context"
	"errors"
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
	if len(paths) == 0 {
		return 0, errors.New("no layers")
	}
	if len(paths) > lsmt.MaxLayers {
		return 0, fmt.Errorf("%d layers exceed the stack limit of %d", len(paths), lsmt.MaxLayers)
	}
	layers := make([]*lsmt.Layer, 0, len(paths))
	for _, p := range paths {
		l, err := lsmt.OpenLayerFile(p)
		if err != nil {
			for _, o := range layers {
				o.Close()
			}
			return 0, err
		}
		layers = append(layers, l)
	}
	st, err := lsmt.NewStack(layers, nil)
	if err != nil {
		for _, o := range layers {
			o.Close()
		}
		return 0, err
	}
	defer st.Close()
	af, err := createAtomic(out)
	if err != nil {
		return 0, err
	}
	written, err := copyStack(ctx, st, af)
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
func copyStack(ctx context.Context, st *lsmt.Stack, f *atomicFile) (int64, error) {
	size := st.Size()
	lowers := st.Lowers()
	buf := make([]byte, readBatch)
	var written int64
	for i, s := range st.MergedIndex().Segments() {
		if i%256 == 0 {
			if err := ctx.Err(); err != nil {
				return written, err
			}
		}
		a := int64(s.Offset) * lsmt.SectorSize
		b := min(int64(s.End())*lsmt.SectorSize, size)
		if s.Zeroed || a >= b {
			continue
		}
		src := lowers[s.Tag].DataReaderAt()
		phys := int64(s.MOffset) * lsmt.SectorSize
		for pos := a; pos < b; {
			chunk := buf[:min(int64(len(buf)), b-pos)]
			n, err := src.ReadAt(chunk, phys+pos-a)
			if n < len(chunk) {
				return written, fmt.Errorf("read layer %s at %d: got %d of %d bytes: %w", lowers[s.Tag].Name(), phys+pos-a, n, len(chunk), err)
			}
			w, err := writeNonZero(f, chunk, pos)
			written += w
			if err != nil {
				return written, err
			}
			pos += int64(len(chunk))
		}
	}
	return written, nil
}

// writeNonZero writes the parts of b (at off) that are not whole zero pages
// (page boundaries taken in the output file), so zero pages stay holes.
func writeNonZero(f *atomicFile, b []byte, off int64) (int64, error) {
	ps := int64(pageSize)
	var written int64
	pieceEnd := func(p int64) int64 { return min((off+p)/ps*ps+ps-off, int64(len(b))) }
	for p := int64(0); p < int64(len(b)); {
		q := pieceEnd(p)
		if isZero(b[p:q]) {
			p = q
			continue
		}
		for q < int64(len(b)) && !isZero(b[q:pieceEnd(q)]) {
			q = pieceEnd(q)
		}
		if _, err := f.WriteAt(b[p:q], off+p); err != nil {
			return written, fmt.Errorf("write at %d: %w", off+p, err)
		}
		written += q - p
		p = q
	}
	return written, nil
}
