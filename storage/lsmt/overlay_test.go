package lsmt

import (
	"math/rand/v2"
	"testing"
)

// randomSegments returns sorted, non-overlapping segments inside [0, span)
// sectors with the given tag, some of them zeroed.
func randomSegments(r *rand.Rand, span uint64, tag uint8) []Segment {
	var segs []Segment
	for off := uint64(r.IntN(4)); off < span; {
		n := uint64(1 + r.IntN(12))
		if off+n > span {
			n = span - off
		}
		if r.IntN(3) > 0 {
			segs = append(segs, Segment{Offset: off, MOffset: uint64(r.IntN(1000)), Length: uint32(n), Zeroed: r.IntN(5) == 0, Tag: tag})
		}
		off += n + uint64(r.IntN(6))
	}
	return segs
}

// sectorMap paints segments, later ones over earlier: what each sector
// reads from (tag, physical sector; -1 for zeros), absent when unmapped.
func sectorMap(layers ...[]Segment) map[uint64][2]int64 {
	m := map[uint64][2]int64{}
	for _, segs := range layers {
		for _, s := range segs {
			for k := range uint64(s.Length) {
				phys := int64(s.MOffset + k)
				if s.Zeroed {
					phys = -1
				}
				m[s.Offset+k] = [2]int64{int64(s.Tag), phys}
			}
		}
	}
	return m
}

// TestOverlayMatchesModel checks Overlay against painting sectors: the upper
// wins where both map, the result is sorted and non-overlapping, and no
// segment is empty.
func TestOverlayMatchesModel(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	for round := range 5000 {
		span := uint64(1 + r.IntN(200))
		lower, upper := randomSegments(r, span, 0), randomSegments(r, span, 1)
		if r.IntN(4) == 0 { // a few large lower segments that several upper ones cut
			lower = []Segment{{Offset: 0, MOffset: 7, Length: uint32(span), Tag: 0}}
		}
		got := Overlay(lower, upper)
		for i, s := range got {
			if s.Length == 0 {
				t.Fatalf("round %d: empty segment %d in %+v", round, i, got)
			}
			if i > 0 && got[i-1].End() > s.Offset {
				t.Fatalf("round %d: segments %d and %d overlap or are out of order: %+v", round, i-1, i, got)
			}
		}
		want, have := sectorMap(lower, upper), sectorMap(got)
		if len(want) != len(have) {
			t.Fatalf("round %d: %d sectors mapped, want %d\nlower %+v\nupper %+v\ngot %+v", round, len(have), len(want), lower, upper, got)
		}
		for sec, w := range want {
			if have[sec] != w {
				t.Fatalf("round %d: sector %d reads %v, want %v\nlower %+v\nupper %+v\ngot %+v", round, sec, have[sec], w, lower, upper, got)
			}
		}
	}
}

// BenchmarkOverlaySmallUpper is a restack's merge: a few new segments over
// a template's large index.
func BenchmarkOverlaySmallUpper(b *testing.B) {
	lower := make([]Segment, 200_000)
	for i := range lower {
		lower[i] = Segment{Offset: uint64(i) * 16, MOffset: uint64(i) * 8, Length: 8}
	}
	upper := []Segment{{Offset: 100, Length: 40, Tag: 1}, {Offset: 1_000_000, Length: 3, Tag: 1}, {Offset: 3_000_000, Length: 64, Tag: 1}}
	for b.Loop() {
		Overlay(lower, upper)
	}
}
