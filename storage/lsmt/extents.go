package lsmt

import (
	"bufio"
	"errors"
	"fmt"
	"io"
)

// ExtentWriter writes a sealed layer from extents handed to it in increasing
// logical order: data extents are packed as given and zeroed extents become
// zeroed mappings (they hide lower layers and take no data). Nothing is read
// back, so the data can come from a stream (another process's memory, a pipe)
// and no zero detection is done on the caller's behalf.
type ExtentWriter struct {
	cw     *countingWriter
	hdr    HeaderTrailer
	segs   []Segment
	next   uint64 // first logical sector not yet covered by an extent
	vsec   uint64 // virtual size in sectors
	err    error  // sticky: the first failure
	closed bool
}

// ErrExtentOrder is returned for an extent that is unaligned, overlaps or
// precedes an earlier one, or runs past the virtual size.
var ErrExtentOrder = errors.New("lsmt: extent out of order or out of range")

// NewExtentWriter starts a sealed layer on w and writes its header. Only
// VirtualSize, UUID (nil: a random one), Parent and Message of opt are used.
func NewExtentWriter(w io.Writer, opt SealOptions) (*ExtentWriter, error) {
	if opt.VirtualSize == 0 || opt.VirtualSize > MaxVirtualSize {
		return nil, fmt.Errorf("new extent writer: virtual size %d outside (0, %d]", opt.VirtualSize, uint64(MaxVirtualSize))
	}
	if opt.UUID.IsNil() {
		opt.UUID = NewUUID()
	}
	x := &ExtentWriter{
		cw: &countingWriter{w: bufio.NewWriterSize(w, 256<<10)},
		hdr: HeaderTrailer{Flags: FlagHeader | FlagData | FlagSealed, VirtualSize: opt.VirtualSize,
			UUID: opt.UUID, ParentUUID: opt.Parent, Tag: opt.Message},
		vsec: (opt.VirtualSize + SectorSize - 1) / SectorSize,
	}
	if _, err := x.cw.Write(x.hdr.Marshal()); err != nil {
		return nil, fmt.Errorf("new extent writer: write header: %w", err)
	}
	return x, nil
}

// UUID is the identity the layer will carry.
func (x *ExtentWriter) UUID() UUID { return x.hdr.UUID }

// claim checks that [off, off+n) bytes is sector aligned, after every earlier
// extent and inside the virtual size, and returns it in sectors.
func (x *ExtentWriter) claim(op string, off, n int64) (uint64, uint64, error) {
	if x.err != nil {
		return 0, 0, x.err
	}
	if x.closed {
		return 0, 0, fmt.Errorf("%s: extent writer is closed", op)
	}
	if off < 0 || n <= 0 || off%SectorSize != 0 || n%SectorSize != 0 {
		return 0, 0, fmt.Errorf("%s [%d,+%d): %w (need 512-aligned offset and length)", op, off, n, ErrExtentOrder)
	}
	s0, sn := uint64(off)/SectorSize, uint64(n)/SectorSize
	if s0 < x.next || s0+sn > x.vsec || s0+sn < s0 {
		return 0, 0, fmt.Errorf("%s [%d,+%d): %w (next free sector %d, virtual size %d sectors)", op, off, n, ErrExtentOrder, x.next, x.vsec)
	}
	return s0, sn, nil
}

// WriteData appends p as the data of the logical bytes [off, off+len(p)).
func (x *ExtentWriter) WriteData(off int64, p []byte) error {
	s0, sn, err := x.claim("write data", off, int64(len(p)))
	if err != nil {
		return err
	}
	phys := uint64(x.cw.n) / SectorSize
	if _, err := x.cw.Write(p); err != nil {
		x.err = fmt.Errorf("write data at %d: %w", off, err)
		return x.err
	}
	x.segs = appendData(x.segs, s0, phys, sn)
	x.next = s0 + sn
	return nil
}

// WriteZeroed maps the logical bytes [off, off+n) as zeroed.
func (x *ExtentWriter) WriteZeroed(off, n int64) error {
	s0, sn, err := x.claim("write zeroed", off, n)
	if err != nil {
		return err
	}
	for rest := sn; rest > 0; {
		l := min(rest, MaxSegmentLen)
		x.segs = append(x.segs, Segment{Offset: s0, Length: uint32(l), Zeroed: true})
		s0, rest = s0+l, rest-l
	}
	x.next = s0
	return nil
}

// Close writes the index and the trailer and flushes. It does not close the
// underlying writer. The result's Segments counts mappings after merging
// neighbours.
func (x *ExtentWriter) Close() (SealResult, error) {
	var res SealResult
	if x.err != nil {
		return res, x.err
	}
	if x.closed {
		return res, fmt.Errorf("close extent writer: already closed")
	}
	x.closed = true
	out := Compact(x.segs)
	res.DataSize = x.cw.n - HeaderSize
	indexOffset := uint64(x.cw.n) // data is 512-aligned by construction
	padded := (len(out) + IndexAlignCount - 1) / IndexAlignCount * IndexAlignCount
	ent := make([]byte, MappingSize*IndexAlignCount)
	for i := 0; i < padded; i += IndexAlignCount {
		for k := range IndexAlignCount {
			s := PaddingMapping
			if i+k < len(out) {
				s = out[i+k]
			}
			EncodeMapping(ent[k*MappingSize:], s)
		}
		if _, err := x.cw.Write(ent); err != nil {
			x.err = fmt.Errorf("write index: %w", err)
			return res, x.err
		}
	}
	if pad := (HeaderSize - x.cw.n%HeaderSize) % HeaderSize; pad > 0 {
		if _, err := x.cw.Write(make([]byte, pad)); err != nil {
			x.err = fmt.Errorf("write padding: %w", err)
			return res, x.err
		}
	}
	tr := x.hdr
	tr.Flags = FlagData | FlagSealed
	tr.IndexOffset = indexOffset
	tr.IndexSize = uint64(padded)
	if _, err := x.cw.Write(tr.Marshal()); err != nil {
		x.err = fmt.Errorf("write trailer: %w", err)
		return res, x.err
	}
	if err := x.cw.w.Flush(); err != nil {
		x.err = fmt.Errorf("flush layer: %w", err)
		return res, x.err
	}
	res.Trailer, res.Segments, res.FileSize = tr, len(out), x.cw.n
	return res, nil
}
