package image

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"

	"github.com/agentenv/agentenv/storage/lsmt"
)

// zeroPadded reads a file and returns zeros past its end (up to the next sector).
type zeroPadded struct {
	f    *os.File
	size int64
}

func (z zeroPadded) ReadAt(p []byte, off int64) (int, error) {
	n, err := z.f.ReadAt(p, off)
	if n < len(p) && err == io.EOF {
		clear(p[n:])
		return len(p), nil
	}
	return n, err
}

// dataExtents lists the sectors of f that hold data (SEEK_DATA/SEEK_HOLE),
// as segments mapping each sector to itself. A seek error other than "no
// more data" is an error: the data past it would be silently dropped.
func dataExtents(f *os.File, size int64) ([]lsmt.Segment, error) {
	var segs []lsmt.Segment
	err := lsmt.DataRanges(f, 0, size, func(a, b int64) {
		s0 := uint64(a) / lsmt.SectorSize
		s1 := (uint64(b) + lsmt.SectorSize - 1) / lsmt.SectorSize
		for s := s0; s < s1; {
			n := min(s1-s, lsmt.MaxSegmentLen)
			segs = append(segs, lsmt.Segment{Offset: s, MOffset: s, Length: uint32(n)})
			s += n
		}
	})
	return segs, err
}

// ImportRaw writes a raw disk file as one sealed layer at out (no parent).
// Holes and all-zero sectors are left unmapped; the virtual size is the file
// size rounded up to a sector.
func ImportRaw(ctx context.Context, raw, out string, opt CommitOptions) (LayerInfo, error) {
	f, err := os.Open(raw)
	if err != nil {
		return LayerInfo{}, fmt.Errorf("import raw: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return LayerInfo{}, fmt.Errorf("import raw %s: %w", raw, err)
	}
	if st.Size() == 0 {
		return LayerInfo{}, fmt.Errorf("import raw %s: empty file", raw)
	}
	vs := (st.Size() + lsmt.SectorSize - 1) / lsmt.SectorSize * lsmt.SectorSize
	segs, err := dataExtents(f, st.Size())
	if err != nil {
		return LayerInfo{}, fmt.Errorf("import raw %s: %w", raw, err)
	}
	src := zeroPadded{f: f, size: st.Size()}
	info, err := writeAtomic(out, opt.Compress, func(w io.Writer) (lsmt.SealResult, error) {
		return lsmt.WriteSealed(ctx, w, segs, func(uint8) io.ReaderAt { return src },
			lsmt.SealOptions{VirtualSize: uint64(vs), Message: opt.Message, Zero: lsmt.ZeroDrop})
	})
	if err != nil {
		return info, fmt.Errorf("import raw %s into %s: %w", raw, out, err)
	}
	return info, nil
}

// Export writes the flattened virtual disk of r (size bytes) to the raw file
// at path, leaving all-zero chunks as holes.
func Export(ctx context.Context, r interface {
	io.ReaderAt
	Size() int64
}, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("export: %w", err)
	}
	defer f.Close()
	size := r.Size()
	buf := make([]byte, 1<<20)
	zero := make([]byte, len(buf))
	for off := int64(0); off < size; off += int64(len(buf)) {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := int(min(int64(len(buf)), size-off))
		if _, err := r.ReadAt(buf[:n], off); err != nil && err != io.EOF {
			return fmt.Errorf("export to %s: read at %d: %w", path, off, err)
		}
		if bytes.Equal(buf[:n], zero[:n]) {
			continue
		}
		if _, err := f.WriteAt(buf[:n], off); err != nil {
			return fmt.Errorf("export to %s: %w", path, err)
		}
	}
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("export to %s: %w", path, err)
	}
	return f.Sync()
}
