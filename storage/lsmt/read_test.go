package lsmt

import (
	"bytes"
	"io"
	"os"
	"testing"

	"pgregory.net/rapid"
)

// vecReader is an in-memory source with vectored reads, like storage/blob's
// files; reads counts the calls.
type vecReader struct {
	*bytes.Reader
	reads *int
}

func (v vecReader) ReadAt(p []byte, off int64) (int, error) {
	*v.reads++
	return v.Reader.ReadAt(p, off)
}

func (v vecReader) ReadvAt(bufs [][]byte, off int64) (int, error) {
	*v.reads++
	done := 0
	for _, b := range bufs {
		n, err := v.Reader.ReadAt(b, off+int64(done))
		done += n
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// fileSrc is a layer file that lends its descriptor to io_uring batches,
// like storage/blob's files.
type fileSrc struct{ *os.File }

func (f fileSrc) AcquireFd() (int, bool) { return int(f.Fd()), true }
func (f fileSrc) ReleaseFd()             {}

// tempSource writes b to a temporary file for the batched read path.
func tempSource(t *rapid.T, b []byte) fileSrc {
	f, err := os.CreateTemp("", "lsmt-read-*")
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(f.Name()) // gone when closed
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
	return fileSrc{f}
}

const readTestSectors = 96

// drawLayout draws sorted, non-overlapping segments of up to tags layers
// whose physical placement is drawn to hit every case of the gathering read
// path: back to back with the layer's previous piece, behind a hole of the
// same size as the logical gap (with unrelated data in the hole), or anywhere.
func drawLayout(t *rapid.T, tags int) []Segment {
	var segs []Segment
	lastPhys := make([]uint64, tags)
	lastEnd := make([]uint64, tags)
	for i := range lastPhys {
		lastPhys[i] = 8
	}
	for off := uint64(0); off < readTestSectors; {
		off += uint64(rapid.IntRange(0, 3).Draw(t, "gap"))
		l := uint64(rapid.IntRange(1, 6).Draw(t, "len"))
		if off+l > readTestSectors {
			break
		}
		tag := rapid.IntRange(0, tags-1).Draw(t, "tag")
		s := Segment{Offset: off, Length: uint32(l), Tag: uint8(tag)}
		switch rapid.IntRange(0, 4).Draw(t, "place") {
		case 0:
			s.Zeroed = true
		case 1:
			s.MOffset = lastPhys[tag]
		case 2:
			s.MOffset = lastPhys[tag] + (off - min(off, lastEnd[tag]))
		default:
			s.MOffset = uint64(rapid.IntRange(8, 2*readTestSectors).Draw(t, "phys"))
		}
		if !s.Zeroed {
			if s.MOffset+l > 3*readTestSectors {
				s.MOffset = 8
			}
			lastPhys[tag], lastEnd[tag] = s.MOffset+l, off+l
		}
		segs = append(segs, s)
		off += l
	}
	return segs
}

func pattern(seed byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7) + byte(i>>9)
	}
	return b
}

// TestGatheredReadsMatchPieceByPiece: the gathering read path (vectored
// reads and reads through holes) gives exactly the bytes that reading every
// piece on its own gives, for any layout, request and gap filler.
func TestGatheredReadsMatchPieceByPiece(t *testing.T) {
	rapid.Check(t, gatheredMatchesPieces)
}

// FuzzGatheredReads runs the same property on layouts drawn from fuzz input.
func FuzzGatheredReads(f *testing.F) {
	f.Fuzz(rapid.MakeFuzz(gatheredMatchesPieces))
}

func gatheredMatchesPieces(t *rapid.T) {
	tags := rapid.IntRange(1, 4).Draw(t, "tags")
	segs := drawLayout(t, tags)
	kind := rapid.SampledFrom([]string{"reader", "vector", "file"}).Draw(t, "source")
	vector := kind == "vector"
	var reads int
	srcs := make([]io.ReaderAt, tags)
	for i := range srcs {
		data := pattern(byte(i*50+1), 3*readTestSectors*SectorSize)
		r := bytes.NewReader(data)
		switch kind {
		case "vector":
			srcs[i] = vecReader{r, &reads}
		case "file": // io_uring batches where the kernel has them
			f := tempSource(t, data)
			defer f.Close()
			srcs[i] = f
		default:
			srcs[i] = r
		}
	}
	var gap func([]byte, int64) error
	if rapid.Bool().Draw(t, "gapFiller") {
		fill := pattern(222, readTestSectors*SectorSize)
		gap = func(q []byte, off int64) error { copy(q, fill[off:]); return nil }
	}
	off := int64(rapid.IntRange(0, readTestSectors*SectorSize-1).Draw(t, "off"))
	n := rapid.IntRange(1, readTestSectors*SectorSize-int(off)).Draw(t, "n")
	s0, ns := sectorSpan(off, n)
	clipped := NewIndex(segs).Lookup(nil, s0, ns)
	want := bytes.Repeat([]byte{0xa5}, n)
	if err := readEach(want, off, clipped, srcs, gap); err != nil {
		t.Fatal(err)
	}
	pieceReads := reads
	reads = 0
	got := bytes.Repeat([]byte{0x5a}, n)
	if err := readSegments(got, off, clipped, srcs, gap); err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(got, want); i < n {
		t.Fatalf("byte %d of [%d,+%d) differs: got %#x, want %#x (segments %+v)", i, off, n, got[i], want[i], clipped)
	}
	if vector && reads > pieceReads {
		t.Fatalf("gathered path made %d reads, piece by piece %d", reads, pieceReads)
	}
}

// TestHoleWithForeignData is the case that makes reading through holes
// subtle: a layer's two pieces sit exactly a hole apart in its file, but the
// hole holds data of another logical range, and a lower layer serves the
// logical hole. The lower layer's bytes must win.
func TestHoleWithForeignData(t *testing.T) {
	t.Parallel()
	base := pattern(1, 64*SectorSize)
	top := pattern(100, 64*SectorSize)
	var reads int
	srcs := []io.ReaderAt{vecReader{bytes.NewReader(base), &reads}, vecReader{bytes.NewReader(top), &reads}}
	lower := []Segment{{Offset: 0, MOffset: 8, Length: 24, Tag: 0}}
	upper := []Segment{
		{Offset: 0, MOffset: 8, Length: 8, Tag: 1},   // top file [8,16)
		{Offset: 16, MOffset: 24, Length: 8, Tag: 1}, // top file [24,32): a hole of 8 = the logical gap
	}
	segs := NewIndex(Overlay(lower, upper)).Segments()
	p := make([]byte, 24*SectorSize)
	if err := readSegments(p, 0, segs, srcs, nil); err != nil {
		t.Fatal(err)
	}
	want := slices3(top[8*SectorSize:16*SectorSize], base[16*SectorSize:24*SectorSize], top[24*SectorSize:32*SectorSize])
	if i := firstDiff(p, want); i < len(p) {
		t.Fatalf("byte %d differs", i)
	}
	if reads != 2 {
		t.Fatalf("%d reads, want 2 (one through the hole of the top layer, one of the base)", reads)
	}
}

func slices3(a, b, c []byte) []byte {
	return append(append(bytes.Clone(a), b...), c...)
}

// TestReadRunShortSource: a vectored read that ends early is an error
// naming the range, never a silent short read.
func TestReadRunShortSource(t *testing.T) {
	t.Parallel()
	var reads int
	src := vecReader{bytes.NewReader(make([]byte, 1000)), &reads}
	err := readRun(src, [][]byte{make([]byte, 600), make([]byte, 600)}, 0)
	if err == nil || !bytes.Contains([]byte(err.Error()), []byte("1200 bytes at offset 0")) {
		t.Fatalf("err = %v", err)
	}
}
