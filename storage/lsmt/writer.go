package lsmt

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
)

// ZeroMode says what the sealer does with data that is all zeros.
type ZeroMode int

const (
	// ZeroKeep copies zero data like any other data.
	ZeroKeep ZeroMode = iota
	// ZeroMark turns zero sectors into zeroed mappings (they still hide lower layers).
	ZeroMark
	// ZeroDrop leaves zero sectors unmapped; right only for a bottom layer or an import.
	ZeroDrop
)

// SealOptions describe the sealed layer to write.
type SealOptions struct {
	VirtualSize uint64 // bytes
	UUID        UUID   // nil: a random one
	Parent      UUID
	Message     string
	Zero        ZeroMode
}

// SealResult describes a written sealed layer.
type SealResult struct {
	Trailer  HeaderTrailer
	Segments int   // mappings written (without padding)
	DataSize int64 // bytes of data
	FileSize int64
}

const copyChunkSectors = 2048 // 1 MiB

type countingWriter struct {
	w *bufio.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// WriteSealed writes a sealed layer to w: header, the data of segs (read from
// src(tag) at their physical offsets) packed in logical order, the index, and
// the trailer. segs must be sorted and non-overlapping.
func WriteSealed(ctx context.Context, w io.Writer, segs []Segment, src func(tag uint8) io.ReaderAt, opt SealOptions) (SealResult, error) {
	var res SealResult
	if opt.UUID.IsNil() {
		opt.UUID = NewUUID()
	}
	cw := &countingWriter{w: bufio.NewWriterSize(w, 256<<10)}
	hdr := HeaderTrailer{Flags: FlagHeader | FlagData | FlagSealed, VirtualSize: opt.VirtualSize,
		UUID: opt.UUID, ParentUUID: opt.Parent, Tag: opt.Message}
	if _, err := cw.Write(hdr.Marshal()); err != nil {
		return res, fmt.Errorf("write header: %w", err)
	}
	out := make([]Segment, 0, len(segs))
	longest := uint32(0)
	for _, s := range segs {
		if !s.Zeroed {
			longest = max(longest, s.Length)
		}
	}
	buf := make([]byte, min(copyChunkSectors, longest)*SectorSize)
	for i, s := range segs {
		if i%64 == 0 {
			if err := ctx.Err(); err != nil {
				return res, err
			}
		}
		if s.Zeroed {
			if opt.Zero != ZeroDrop {
				out = append(out, Segment{Offset: s.Offset, Length: s.Length, Zeroed: true})
			}
			continue
		}
		var err error
		if out, err = copySegment(cw, out, buf, s, src(s.Tag), opt.Zero); err != nil {
			return res, err
		}
	}
	out = Compact(out)
	res.DataSize = cw.n - HeaderSize
	// Data ends 512-aligned by construction; the index follows.
	tr, err := writeIndexTrailer(cw, out, hdr)
	if err != nil {
		return res, err
	}
	if err := cw.w.Flush(); err != nil {
		return res, fmt.Errorf("write layer: %w", err)
	}
	res.Trailer, res.Segments, res.FileSize = tr, len(out), cw.n
	return res, nil
}

// writeIndexTrailer writes the index of out (padded) at cw's offset, which
// must be 512-aligned, then the trailer, and returns the trailer.
func writeIndexTrailer(cw *countingWriter, out []Segment, hdr HeaderTrailer) (HeaderTrailer, error) {
	indexOffset := uint64(cw.n)
	n := len(out)
	padded := (n + IndexAlignCount - 1) / IndexAlignCount * IndexAlignCount
	ent := make([]byte, MappingSize)
	for i := 0; i < padded; i++ {
		s := PaddingMapping
		if i < n {
			s = out[i]
		}
		EncodeMapping(ent, s)
		if _, err := cw.Write(ent); err != nil {
			return hdr, fmt.Errorf("write index: %w", err)
		}
	}
	if pad := (HeaderSize - cw.n%HeaderSize) % HeaderSize; pad > 0 {
		if _, err := cw.Write(make([]byte, pad)); err != nil {
			return hdr, fmt.Errorf("write padding: %w", err)
		}
	}
	tr := hdr
	tr.Flags = FlagData | FlagSealed
	tr.IndexOffset = indexOffset
	tr.IndexSize = uint64(padded)
	if _, err := cw.Write(tr.Marshal()); err != nil {
		return hdr, fmt.Errorf("write trailer: %w", err)
	}
	return tr, nil
}

// SealInPlace makes f a sealed layer around data already in it: segs map
// virtual sectors to f's own sectors (MOffset counts from the start of the
// file, so data starts at HeaderSize) and lie below dataEnd, a multiple of
// SectorSize. It writes the header at offset 0 and the index and trailer
// right after the last mapped sector (what lies past it is a hole the layer
// does not keep), and truncates f after the trailer. The data is never
// copied: a tool that writes a disk image at offset HeaderSize of f (mke2fs
// -E offset=) makes the layer's data itself. segs must be sorted and
// non-overlapping. The caller syncs f.
func SealInPlace(f interface {
	io.WriterAt
	Truncate(size int64) error
}, dataEnd int64, segs []Segment, opt SealOptions) (SealResult, error) {
	var res SealResult
	if dataEnd < HeaderSize || dataEnd%SectorSize != 0 {
		return res, fmt.Errorf("seal in place: data end %d below the header or not 512-aligned", dataEnd)
	}
	indexAt := int64(HeaderSize)
	for _, s := range segs {
		end := int64(s.MOffset+uint64(s.Length)) * SectorSize
		if s.Zeroed || s.MOffset < HeaderSize/SectorSize || end > dataEnd {
			return res, fmt.Errorf("seal in place: mapping %+v outside the data [%d,%d)", s, HeaderSize, dataEnd)
		}
		indexAt = max(indexAt, end)
	}
	if opt.UUID.IsNil() {
		opt.UUID = NewUUID()
	}
	hdr := HeaderTrailer{Flags: FlagHeader | FlagData | FlagSealed, VirtualSize: opt.VirtualSize,
		UUID: opt.UUID, ParentUUID: opt.Parent, Tag: opt.Message}
	if _, err := f.WriteAt(hdr.Marshal(), 0); err != nil {
		return res, fmt.Errorf("seal in place: write header: %w", err)
	}
	out := Compact(segs)
	cw := &countingWriter{w: bufio.NewWriterSize(io.NewOffsetWriter(f, indexAt), 256<<10), n: indexAt}
	tr, err := writeIndexTrailer(cw, out, hdr)
	if err != nil {
		return res, fmt.Errorf("seal in place: %w", err)
	}
	if err := cw.w.Flush(); err != nil {
		return res, fmt.Errorf("seal in place: %w", err)
	}
	if err := f.Truncate(cw.n); err != nil {
		return res, fmt.Errorf("seal in place: %w", err)
	}
	res.Trailer, res.Segments, res.FileSize = tr, len(out), cw.n
	for _, s := range out {
		res.DataSize += int64(s.Length) * SectorSize
	}
	return res, nil
}

// copySegment copies the data of s into cw, splitting off zero sectors per mode,
// and appends the new mappings to out.
func copySegment(cw *countingWriter, out []Segment, buf []byte, s Segment, r io.ReaderAt, mode ZeroMode) ([]Segment, error) {
	for done := uint64(0); done < uint64(s.Length); {
		n := min(uint64(s.Length)-done, copyChunkSectors)
		chunk := buf[:n*SectorSize]
		if err := readFull(r, chunk, int64(s.MOffset+done)*SectorSize); err != nil {
			return out, fmt.Errorf("read data of sectors [%d,%d): %w", s.Offset+done, s.Offset+done+n, err)
		}
		logical := s.Offset + done
		if mode == ZeroKeep {
			out = appendData(out, logical, uint64(cw.n)/SectorSize, n)
			if _, err := cw.Write(chunk); err != nil {
				return out, fmt.Errorf("write data: %w", err)
			}
		} else {
			var err error
			if out, err = copyDetectZero(cw, out, chunk, logical, mode); err != nil {
				return out, err
			}
		}
		done += n
	}
	return out, nil
}

var zeroSector [SectorSize]byte

func copyDetectZero(cw *countingWriter, out []Segment, chunk []byte, logical uint64, mode ZeroMode) ([]Segment, error) {
	n := uint64(len(chunk) / SectorSize)
	for i := uint64(0); i < n; {
		zero := bytes.Equal(chunk[i*SectorSize:(i+1)*SectorSize], zeroSector[:])
		j := i + 1
		for j < n && bytes.Equal(chunk[j*SectorSize:(j+1)*SectorSize], zeroSector[:]) == zero {
			j++
		}
		switch {
		case zero && mode == ZeroMark:
			out = append(out, Segment{Offset: logical + i, Length: uint32(j - i), Zeroed: true})
		case zero:
			// dropped: reads fall through to zeros
		default:
			out = appendData(out, logical+i, uint64(cw.n)/SectorSize, j-i)
			if _, err := cw.Write(chunk[i*SectorSize : j*SectorSize]); err != nil {
				return out, fmt.Errorf("write data: %w", err)
			}
		}
		i = j
	}
	return out, nil
}

func appendData(out []Segment, logical, phys, n uint64) []Segment {
	for n > 0 {
		l := min(n, MaxSegmentLen)
		out = append(out, Segment{Offset: logical, MOffset: phys, Length: uint32(l)})
		logical, phys, n = logical+l, phys+l, n-l
	}
	return out
}
