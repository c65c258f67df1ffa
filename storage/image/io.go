package image

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/agentenv/agentenv/internal/atomicfile"
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

// dataExtents lists the sectors of f in [base, base+size) that hold data
// (SEEK_DATA/SEEK_HOLE), as segments mapping the disk sector s to the file
// sector base/512+s. A seek error other than "no more data" is an error: the
// data past it would be silently dropped.
func dataExtents(f *os.File, base, size int64) ([]lsmt.Segment, error) {
	var segs []lsmt.Segment
	shift := uint64(base) / lsmt.SectorSize
	err := lsmt.DataRanges(f, base, base+size, func(a, b int64) {
		s0 := uint64(a)/lsmt.SectorSize - shift
		s1 := (uint64(b)+lsmt.SectorSize-1)/lsmt.SectorSize - shift
		for s := s0; s < s1; {
			n := min(s1-s, lsmt.MaxSegmentLen)
			segs = append(segs, lsmt.Segment{Offset: s, MOffset: s + shift, Length: uint32(n)})
			s += n
		}
	})
	return segs, err
}

// BuildRaw makes a sealed layer at out (no parent) of a raw disk of size
// bytes that write puts into the file at path, starting at byte offset off
// (a tool that formats a disk image at an offset, such as mke2fs -E
// offset=). Uncompressed, the disk is written inside the layer file itself,
// past the header, and sealed in place around it: its data is never copied
// and the layer is synced once, then renamed (internal/atomicfile), so out
// is never a partial layer. Compressed, the disk goes to a temporary file
// next to out that ImportRaw compresses.
func BuildRaw(ctx context.Context, out string, size int64, opt CommitOptions, write func(ctx context.Context, path string, off int64) error) (LayerInfo, error) {
	if size <= 0 {
		return LayerInfo{}, fmt.Errorf("build raw %s: size %d", out, size)
	}
	if opt.Compress != nil {
		return buildRawCopy(ctx, out, size, opt, write)
	}
	f, err := atomicfile.Create(out, 0o600)
	if err != nil {
		return LayerInfo{}, fmt.Errorf("build raw %s: %w", out, err)
	}
	defer f.Abort()
	vs := (size + lsmt.SectorSize - 1) / lsmt.SectorSize * lsmt.SectorSize
	if err := write(ctx, f.Name(), lsmt.HeaderSize); err != nil {
		return LayerInfo{}, fmt.Errorf("build raw %s: %w", out, err)
	}
	end := lsmt.HeaderSize + vs
	if st, err := f.Stat(); err != nil || st.Size() > end {
		return LayerInfo{}, fmt.Errorf("build raw %s: the disk written is larger than %d bytes (%v)", out, size, err)
	}
	segs, err := dataExtents(f.File, lsmt.HeaderSize, vs)
	if err != nil {
		return LayerInfo{}, fmt.Errorf("build raw %s: %w", out, err)
	}
	res, err := lsmt.SealInPlace(f, end, segs, lsmt.SealOptions{VirtualSize: uint64(vs), Message: opt.Message})
	if err != nil {
		return LayerInfo{}, fmt.Errorf("build raw %s: %w", out, err)
	}
	if err := f.Commit(); err != nil {
		return LayerInfo{}, fmt.Errorf("build raw %s: %w", out, err)
	}
	return LayerInfo{Path: out, UUID: res.Trailer.UUID, ParentUUID: res.Trailer.ParentUUID,
		Size: res.FileSize, Segments: res.Segments, DataSize: res.DataSize}, nil
}

// buildRawCopy is BuildRaw through a temporary raw disk and ImportRaw.
func buildRawCopy(ctx context.Context, out string, size int64, opt CommitOptions, write func(ctx context.Context, path string, off int64) error) (LayerInfo, error) {
	raw, err := os.CreateTemp(filepath.Dir(out), ".raw-*")
	if err != nil {
		return LayerInfo{}, fmt.Errorf("build raw %s: %w", out, err)
	}
	defer os.Remove(raw.Name())
	raw.Close()
	if err := write(ctx, raw.Name(), 0); err != nil {
		return LayerInfo{}, fmt.Errorf("build raw %s: %w", out, err)
	}
	if st, err := os.Stat(raw.Name()); err != nil || st.Size() > size {
		return LayerInfo{}, fmt.Errorf("build raw %s: the disk written is larger than %d bytes (%v)", out, size, err)
	}
	if err := os.Truncate(raw.Name(), size); err != nil {
		return LayerInfo{}, fmt.Errorf("build raw %s: %w", out, err)
	}
	return ImportRaw(ctx, raw.Name(), out, opt)
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
	segs, err := dataExtents(f, 0, st.Size())
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
