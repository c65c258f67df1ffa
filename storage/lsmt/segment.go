package lsmt

import (
	"encoding/binary"
	"fmt"
	"sort"
)

// Segment maps Length sectors at logical sector Offset to physical sector MOffset
// of the layer that Tag names. A Zeroed segment reads as zeros and has no data.
type Segment struct {
	Offset  uint64 // logical sector
	MOffset uint64 // physical sector inside the layer file
	Length  uint32 // sectors
	Zeroed  bool
	Tag     uint8 // runtime only: which layer of a stack serves the range
}

// End is the first logical sector after s.
func (s Segment) End() uint64 { return s.Offset + uint64(s.Length) }

// Clip returns the part of s inside [off, end), which must overlap s.
func (s Segment) Clip(off, end uint64) Segment {
	if off > s.Offset {
		d := off - s.Offset
		s.Offset = off
		s.Length -= uint32(d)
		if !s.Zeroed {
			s.MOffset += d
		}
	}
	if e := s.End(); e > end {
		s.Length -= uint32(e - end)
	}
	return s
}

// IsPadding reports whether a decoded mapping is padding (length 0).
func (s Segment) IsPadding() bool { return s.Length == 0 }

// EncodeMapping writes s as a 16-byte on-disk mapping. The tag is written as 0.
func EncodeMapping(b []byte, s Segment) {
	w0 := s.Offset&MaxLogicalOff | uint64(s.Length)<<50
	w1 := s.MOffset & MaxPhysicalOff
	if s.Zeroed {
		w1 |= 1 << 55
	}
	binary.LittleEndian.PutUint64(b[0:], w0)
	binary.LittleEndian.PutUint64(b[8:], w1)
}

// DecodeMapping reads a 16-byte on-disk mapping; the tag is reset to 0.
func DecodeMapping(b []byte) Segment {
	w0 := binary.LittleEndian.Uint64(b[0:])
	w1 := binary.LittleEndian.Uint64(b[8:])
	return Segment{
		Offset:  w0 & MaxLogicalOff,
		Length:  uint32(w0 >> 50),
		MOffset: w1 & MaxPhysicalOff,
		Zeroed:  w1&(1<<55) != 0,
	}
}

// PaddingMapping is the on-disk filler entry of a sealed index.
var PaddingMapping = Segment{Offset: MaxLogicalOff}

// Index is an immutable set of non-overlapping segments sorted by offset.
// A lookup is a binary search over a small summary (the end of every 64th
// segment, which stays in cache) and then within one run of 64 segments, so
// a million segments cost two short searches and few cache misses.
type Index struct {
	segs []Segment
	tops []uint64 // tops[b] = end of the last segment of run b
}

const runLen = 64

// NewIndex wraps segments that are already sorted and non-overlapping.
func NewIndex(segs []Segment) *Index {
	x := &Index{segs: segs, tops: make([]uint64, (len(segs)+runLen-1)/runLen)}
	for b := range x.tops {
		x.tops[b] = segs[min((b+1)*runLen, len(segs))-1].End()
	}
	return x
}

// Segments returns the sorted segments; callers must not modify them.
func (x *Index) Segments() []Segment { return x.segs }

// Len is the number of segments.
func (x *Index) Len() int { return len(x.segs) }

// Lookup appends to dst the pieces of segments that overlap the sector range
// [off, off+n), clipped to it, in order.
func (x *Index) Lookup(dst []Segment, off, n uint64) []Segment {
	end := off + n
	segs := x.segs
	// The first run whose last end is past off holds the first segment whose
	// end is past off.
	b, bh := 0, len(x.tops)
	for b < bh {
		m := int(uint(b+bh) >> 1)
		if x.tops[m] <= off {
			b = m + 1
		} else {
			bh = m
		}
	}
	lo, hi := b*runLen, min((b+1)*runLen, len(segs))
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if segs[m].Offset+uint64(segs[m].Length) <= off {
			lo = m + 1
		} else {
			hi = m
		}
	}
	for i := lo; i < len(segs) && segs[i].Offset < end; i++ {
		dst = append(dst, segs[i].Clip(off, end))
	}
	return dst
}

// validateSegments checks that segs are sorted, non-overlapping, within the
// virtual size, and (for data segments) inside [dataStart, dataEnd) sectors.
func validateSegments(segs []Segment, virtualSectors, dataStart, dataEnd uint64) error {
	var prevEnd uint64
	for i, s := range segs {
		if s.Length == 0 || s.Length > MaxSegmentLen {
			return fmt.Errorf("%w: mapping %d has length %d", ErrFormat, i, s.Length)
		}
		if s.Offset < prevEnd {
			return fmt.Errorf("%w: mapping %d (sector %d) overlaps or is out of order", ErrFormat, i, s.Offset)
		}
		if s.End() > virtualSectors {
			return fmt.Errorf("%w: mapping %d ends at sector %d past the virtual size (%d sectors)", ErrFormat, i, s.End(), virtualSectors)
		}
		if !s.Zeroed && (s.MOffset < dataStart || s.MOffset+uint64(s.Length) > dataEnd) {
			return fmt.Errorf("%w: mapping %d points at sectors [%d,%d) outside the data area [%d,%d)", ErrFormat, i, s.MOffset, s.MOffset+uint64(s.Length), dataStart, dataEnd)
		}
		prevEnd = s.End()
	}
	return nil
}

// Overlay returns the segments of upper over lower: upper wins where both map.
// Both inputs must be sorted and non-overlapping; so is the result. Lower
// segments no upper segment touches are copied in runs found by binary
// search, so a small upper over a large lower (a restack's new layer over a
// template's) costs little more than a copy of the lower.
func Overlay(lower, upper []Segment) []Segment {
	// An upper segment splits at most one lower segment in two.
	o := overlay{lower: lower, out: make([]Segment, 0, len(lower)+2*len(upper))}
	for _, u := range upper {
		o.before(u.Offset)
		o.cut(u)
		o.out = append(o.out, u)
	}
	o.rest()
	return o.out
}

// overlay is Overlay's cursor over lower: lower[i] is the next segment to
// place, or tail instead of it when an upper segment covered its head.
type overlay struct {
	lower, out []Segment
	i          int
	tail       Segment
	clipped    bool
}

// current is the next lower segment to place (ok false when none is left).
func (o *overlay) current() (s Segment, ok bool) {
	if o.clipped {
		return o.tail, true
	}
	if o.i < len(o.lower) {
		return o.lower[o.i], true
	}
	return Segment{}, false
}

func (o *overlay) advance() { o.i, o.clipped = o.i+1, false }

// before places the lower segments that end at or before sector off whole.
func (o *overlay) before(off uint64) {
	if o.clipped {
		if o.tail.End() > off {
			return
		}
		o.out = append(o.out, o.tail)
		o.advance()
	}
	rest := o.lower[o.i:]
	k := sort.Search(len(rest), func(k int) bool { return rest[k].End() > off })
	o.out = append(o.out, rest[:k]...)
	o.i += k
}

// cut places the parts of the lower segments overlapping u that lie before
// it and keeps a part that lies after it for the next upper segment.
func (o *overlay) cut(u Segment) {
	for l, ok := o.current(); ok && l.Offset < u.End(); l, ok = o.current() {
		if l.Offset < u.Offset {
			o.out = append(o.out, l.Clip(l.Offset, u.Offset))
		}
		if l.End() > u.End() {
			o.tail, o.clipped = l.Clip(u.End(), l.End()), true
			return
		}
		o.advance()
	}
}

// rest places what is left of lower.
func (o *overlay) rest() {
	if o.clipped {
		o.out = append(o.out, o.tail)
		o.advance()
	}
	o.out = append(o.out, o.lower[o.i:]...)
}

// MergeIndexes overlays the layers' indexes, bottom first, tagging each segment
// with its layer's position. It is the read index of a stack of sealed layers.
func MergeIndexes(layers []*Index) *Index {
	var acc []Segment
	for i, x := range layers {
		tagged := make([]Segment, len(x.segs))
		for k, s := range x.segs {
			s.Tag = uint8(i)
			tagged[k] = s
		}
		if i == 0 {
			acc = tagged
			continue
		}
		acc = Overlay(acc, tagged)
	}
	return NewIndex(acc)
}

// Compact merges neighbours that are contiguous logically and physically, with
// the same zeroed flag and tag, while the combined length fits a mapping.
func Compact(segs []Segment) []Segment {
	if len(segs) == 0 {
		return segs
	}
	out := segs[:1]
	for _, s := range segs[1:] {
		p := &out[len(out)-1]
		if p.End() == s.Offset && p.Zeroed == s.Zeroed && p.Tag == s.Tag &&
			(s.Zeroed || p.MOffset+uint64(p.Length) == s.MOffset) &&
			uint64(p.Length)+uint64(s.Length) <= MaxSegmentLen {
			p.Length += s.Length
			continue
		}
		out = append(out, s)
	}
	return out
}
