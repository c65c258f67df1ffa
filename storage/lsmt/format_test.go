package lsmt

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Hand-built byte vectors from overlaybd's LSMT format description, written
// out field by field rather than produced by our encoder.

func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

const testUUID = "6f1c2a3b-4d5e-4f60-8172-a3b4c5d6e7f8"
const testParent = "00112233-4455-4677-8899-aabbccddeeff"

// specHeader builds a HeaderTrailer block by hand from the spec's table.
func specHeader(flags uint32, indexOffset, indexSize, vsize uint64, uuid, parent, tag string) []byte {
	b := make([]byte, 4096)
	copy(b[0:], "LSMT\x00\x01\x02\x00")
	copy(b[8:], []byte{0x65, 0x7e, 0x63, 0xd2, 0x94, 0x44, 0x08, 0x4c, 0xa2, 0xd2, 0xc8, 0xec, 0x4f, 0xcf, 0xae, 0x8a})
	binary.LittleEndian.PutUint32(b[24:], 390)
	binary.LittleEndian.PutUint32(b[28:], flags)
	binary.LittleEndian.PutUint64(b[32:], indexOffset)
	binary.LittleEndian.PutUint64(b[40:], indexSize)
	binary.LittleEndian.PutUint64(b[48:], vsize)
	copy(b[56:], uuid)
	copy(b[93:], parent)
	b[132], b[133] = 1, 1
	copy(b[134:], tag)
	return b
}

func TestMagic0IsTheSpecString(t *testing.T) {
	t.Parallel()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], Magic0)
	if string(b[:]) != "LSMT\x00\x01\x02\x00" {
		t.Fatalf("magic0 bytes %q", b)
	}
}

func TestHeaderTrailerLayout(t *testing.T) {
	t.Parallel()
	u, _ := ParseUUID(testUUID)
	p, _ := ParseUUID(testParent)
	h := HeaderTrailer{Flags: FlagData | FlagSealed, IndexOffset: 0x12345600, IndexSize: 512,
		VirtualSize: 10 << 30, UUID: u, ParentUUID: p, Tag: "hello layer"}
	want := specHeader(6, 0x12345600, 512, 10<<30, testUUID, testParent, "hello layer")
	if got := h.Marshal(); !bytes.Equal(got, want) {
		t.Fatalf("Marshal differs from the hand-built block at byte %d", firstDiff(got, want))
	}
	back, err := ParseHeaderTrailer(want)
	if err != nil {
		t.Fatal(err)
	}
	back.Version, back.SubVersion = 0, 0
	if back != h {
		t.Fatalf("parsed %+v, want %+v", back, h)
	}
	// The nil UUID is written in its hyphenated form.
	nilH := (&HeaderTrailer{}).Marshal()
	if got := string(nilH[56:92]); got != "00000000-0000-0000-0000-000000000000" || nilH[92] != 0 {
		t.Fatalf("nil uuid field %q", got)
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

func TestMappingLayout(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		hex  string
		seg  Segment
	}{
		// offset 5, length 8 (8<<50 = 0x0020_0000_0000_0000), moffset 16.
		{"data", "0500000000002000 1000000000000000", Segment{Offset: 5, Length: 8, MOffset: 16}},
		// zeroed: bit 55 of word 1.
		{"zeroed", "0010000000000400 0000000000008000", Segment{Offset: 0x1000, Length: 1, Zeroed: true}},
		// maximal fields: offset 2^50-1, length 16383, moffset 2^55-1.
		{"max", "ffffffffffffffff ffffffffffff7f00", Segment{Offset: MaxLogicalOff, Length: MaxSegmentLen, MOffset: MaxPhysicalOff}},
		// padding: offset 2^50-1, length 0.
		{"padding", "ffffffffffff0300 0000000000000000", PaddingMapping},
	}
	for _, c := range cases {
		b := unhex(t, c.hex)
		if got := DecodeMapping(b); got != c.seg {
			t.Errorf("%s: decoded %+v, want %+v", c.name, got, c.seg)
		}
		enc := make([]byte, 16)
		EncodeMapping(enc, c.seg)
		if !bytes.Equal(enc, b) {
			t.Errorf("%s: encoded %x, want %x", c.name, enc, b)
		}
	}
	// The tag byte (bits 56..64 of word 1) is runtime only: readers reset it.
	b := unhex(t, "0500000000002000 1000000000000007")
	if s := DecodeMapping(b); s.Tag != 0 || s.MOffset != 16 || s.Zeroed {
		t.Fatalf("tagged entry decoded as %+v", s)
	}
	if !PaddingMapping.IsPadding() {
		t.Fatal("padding entry not recognised")
	}
}

// handSealed builds a sealed layer byte by byte: two data sectors 'A' at
// logical 0, one sector 'B' at logical 10, a zeroed mapping at 20..24.
func handSealed(t testing.TB, vsize uint64) []byte {
	t.Helper()
	var f bytes.Buffer
	f.Write(specHeader(7, 0, 0, vsize, testUUID, testParent, "hand"))
	f.Write(bytes.Repeat([]byte{'A'}, 1024)) // sectors 8,9
	f.Write(bytes.Repeat([]byte{'B'}, 512))  // sector 10
	indexOffset := f.Len()
	ent := [][]byte{
		unhex(t, "0000000000000800 0800000000000000"),    // off 0 len 2 moff 8
		unhex(t, "0a00000000000400 0a00000000000000"),    // off 10 len 1 moff 10
		unhex(t, "1400000000001000 0000000000008000"),    // off 20 len 4 zeroed
		unhex(t, "ffffffffffff0300 0000000000000000")[:]} // explicit padding
	for _, e := range ent {
		f.Write(e)
	}
	for i := len(ent); i < 256; i++ {
		f.Write(unhex(t, "ffffffffffff0300 0000000000000000"))
	}
	for f.Len()%4096 != 0 {
		f.WriteByte(0)
	}
	f.Write(specHeader(6, uint64(indexOffset), 256, vsize, testUUID, testParent, "hand"))
	return f.Bytes()
}

func TestOpenHandBuiltSealedLayer(t *testing.T) {
	t.Parallel()
	const vsize = 64 << 10
	file := handSealed(t, vsize)
	l, err := OpenSealed("hand", bytes.NewReader(file), int64(len(file)))
	if err != nil {
		t.Fatal(err)
	}
	if l.UUID().String() != testUUID || l.ParentUUID().String() != testParent || l.Trailer.Tag != "hand" {
		t.Fatalf("trailer fields %+v", l.Trailer)
	}
	if l.Index().Len() != 3 || l.RawPadding != 253 {
		t.Fatalf("segments %d padding %d", l.Index().Len(), l.RawPadding)
	}
	got := make([]byte, vsize)
	if _, err := l.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, vsize)
	copy(want[0:], bytes.Repeat([]byte{'A'}, 1024))
	copy(want[10*512:], bytes.Repeat([]byte{'B'}, 512))
	if !bytes.Equal(got, want) {
		t.Fatalf("content differs at byte %d", firstDiff(got, want))
	}
}

// TestWriterMatchesHandBuiltLayer: our writer lays out the same content in the
// same bytes (header, packed data, padded index, 4 KiB padding, trailer).
func TestWriterMatchesHandBuiltLayer(t *testing.T) {
	t.Parallel()
	const vsize = 64 << 10
	hand := handSealed(t, vsize)
	src := make([]byte, 4096+1536)
	copy(src[4096:], bytes.Repeat([]byte{'A'}, 1024))
	copy(src[4096+1024:], bytes.Repeat([]byte{'B'}, 512))
	segs := []Segment{{Offset: 0, Length: 2, MOffset: 8}, {Offset: 10, Length: 1, MOffset: 10}, {Offset: 20, Length: 4, Zeroed: true}}
	u, _ := ParseUUID(testUUID)
	p, _ := ParseUUID(testParent)
	var out bytes.Buffer
	res, err := WriteSealed(context.Background(), &out, segs, func(uint8) io.ReaderAt { return bytes.NewReader(src) },
		SealOptions{VirtualSize: vsize, UUID: u, Parent: p, Message: "hand", Zero: ZeroMark})
	if err != nil {
		t.Fatal(err)
	}
	// Our header also carries virtual size, uuids and message; the hand-built
	// one has them too, so the whole file must match byte for byte except for
	// the explicit padding entry, which is identical anyway.
	if !bytes.Equal(out.Bytes(), hand) {
		t.Fatalf("writer output differs from the hand-built layer at byte %d (sizes %d, %d)", firstDiff(out.Bytes(), hand), out.Len(), len(hand))
	}
	if res.Segments != 3 || res.DataSize != 1536 {
		t.Fatalf("result %+v", res)
	}
}

// TestHandBuiltUpper opens a log-structured upper written by hand, with a
// later mapping overriding an earlier one and a torn final entry.
func TestHandBuiltUpper(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const vsize = 32 << 10
	data := specHeader(3, 0, 0, vsize, testUUID, testParent, "")
	data = append(data, bytes.Repeat([]byte{'X'}, 1024)...) // sectors 8,9
	data = append(data, bytes.Repeat([]byte{'Y'}, 512)...)  // sector 10
	index := specHeader(1, 4096, 0, vsize, testUUID, testParent, "")
	index = append(index, unhex(t, "0000000000000800 0800000000000000")...) // [0,2) -> 8 (X X)
	index = append(index, unhex(t, "0100000000000400 0a00000000000000")...) // [1,2) -> 10 (Y), overrides
	index = append(index, unhex(t, "0400000000000400 0000000000008000")...) // [4,5) zeroed
	index = append(index, unhex(t, "0500000000000400 0b")...)               // torn: 9 of 16 bytes
	dp, ip := filepath.Join(dir, "d"), filepath.Join(dir, "i")
	if err := os.WriteFile(dp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ip, index, 0o644); err != nil {
		t.Fatal(err)
	}
	u, err := OpenUpper(dp, ip, false)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if u.Recovered != 9 {
		t.Fatalf("recovered %d torn bytes, want 9", u.Recovered)
	}
	if st, _ := os.Stat(ip); st.Size() != 4096+3*16 {
		t.Fatalf("index not truncated to the last whole entry: %d bytes", st.Size())
	}
	want := []Segment{{Offset: 0, Length: 1, MOffset: 8}, {Offset: 1, Length: 1, MOffset: 10}, {Offset: 4, Length: 1, Zeroed: true}}
	if got := u.Segments(); !equalSegs(got, want) {
		t.Fatalf("segments %+v, want %+v", got, want)
	}
	st, err := NewStack(nil, u)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 3*512)
	if _, err := st.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got[:512], bytes.Repeat([]byte{'X'}, 512)) || !bytes.Equal(got[512:1024], bytes.Repeat([]byte{'Y'}, 512)) || !bytes.Equal(got[1024:], make([]byte, 512)) {
		t.Fatal("upper content differs from the hand-built mappings")
	}
}

func equalSegs(a, b []Segment) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestUpperDropsEntriesPastData: an entry that points past the end of the
// data file (its data never reached the disk) is dropped with everything after.
func TestUpperDropsEntriesPastData(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	dp, ip := filepath.Join(dir, "d"), filepath.Join(dir, "i")
	data := append(specHeader(3, 0, 0, 8192, testUUID, "", ""), bytes.Repeat([]byte{'Z'}, 512)...)
	index := specHeader(1, 4096, 0, 8192, testUUID, "", "")
	index = append(index, unhex(t, "0000000000000400 0800000000000000")...) // ok
	index = append(index, unhex(t, "0100000000000400 0900000000000000")...) // sector 9 not in the file
	index = append(index, unhex(t, "0200000000000400 0800000000000000")...) // after the bad one
	os.WriteFile(dp, data, 0o644)
	os.WriteFile(ip, index, 0o644)
	u, err := OpenUpper(dp, ip, false)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if got := u.Segments(); len(got) != 1 || u.Recovered != 32 {
		t.Fatalf("segments %+v recovered %d", got, u.Recovered)
	}
}

func TestSparseUpperLayout(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := filepath.Join(dir, "sparse")
	u, err := CreateSparseUpper(p, 1<<20, UUID{})
	if err != nil {
		t.Fatal(err)
	}
	blk := bytes.Repeat([]byte{'S'}, 4096)
	if _, err := u.WriteAt(blk, 64<<10); err != nil {
		t.Fatal(err)
	}
	if err := u.Close(); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(p)
	if len(raw) != 4096+1<<20 {
		t.Fatalf("sparse file is %d bytes", len(raw))
	}
	h, err := ParseHeaderTrailer(raw)
	if err != nil || h.Flags != FlagHeader|FlagData|FlagSparse || h.VirtualSize != 1<<20 {
		t.Fatalf("sparse header %+v %v", h, err)
	}
	// Sector s lives at byte 4096 + 512*s.
	if !bytes.Equal(raw[4096+64<<10:4096+68<<10], blk) {
		t.Fatal("sparse data not at 4096 + offset")
	}
	u, err = OpenUpper(p, "", false)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	want := []Segment{{Offset: 128, Length: 8, MOffset: 136}}
	if got := u.Segments(); !equalSegs(got, want) {
		t.Fatalf("mappings rebuilt from holes %+v, want %+v", got, want)
	}
}

func TestStackLayerLimit(t *testing.T) {
	t.Parallel()
	one := writerLayer(t)
	var ls []*Layer
	for range MaxLayers + 1 {
		l, err := OpenSealed("l", bytes.NewReader(one), int64(len(one)))
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	if _, err := NewStack(ls, nil); err == nil {
		t.Fatal("a stack of 256 layers was accepted")
	}
	st, err := NewStackWith(ls[:MaxLayers], nil, StackOptions{AllowReparent: true}) // one layer, repeated
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 128<<10)
	if _, err := ls[0].ReadAt(want, 0); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if _, err := st.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("255 identical layers read differently from one: %v", err)
	}
	if tags := st.MergedIndex().Segments(); tags[0].Tag != MaxLayers-1 {
		t.Fatalf("top layer should serve every range, got tag %d", tags[0].Tag)
	}
}

// TestMillionSegments: an index of a million segments, and an upper with a
// hundred thousand overriding writes, answer lookups correctly.
func TestMillionSegments(t *testing.T) {
	t.Parallel()
	const n = 1_000_000
	segs := make([]Segment, n)
	for i := range segs {
		segs[i] = Segment{Offset: uint64(i) * 16, Length: 8, MOffset: uint64(i)*8 + 8}
	}
	x := NewIndex(segs)
	for _, i := range []uint64{0, 1, 499_999, n - 1} {
		got := x.Lookup(nil, i*16+4, 10) // the second half of segment i and 2 sectors of the gap
		if len(got) != 1 || got[0].Offset != i*16+4 || got[0].Length != 4 || got[0].MOffset != i*8+12 {
			t.Fatalf("lookup in segment %d: %+v", i, got)
		}
		if got := x.Lookup(nil, i*16+8, 8); len(got) != 0 {
			t.Fatalf("lookup in the gap after %d: %+v", i, got)
		}
	}
	dir := t.TempDir()
	u, err := CreateUpper(filepath.Join(dir, "d"), filepath.Join(dir, "i"), 1<<30, UUID{})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	blk := make([]byte, 512)
	for i := range 100_000 {
		// Every other sector, twice over: the second pass overrides the first.
		s := int64(i%50_000) * 2
		if _, err := u.WriteAt(blk, s*512); err != nil {
			t.Fatal(err)
		}
	}
	if u.Len() != 50_000 {
		t.Fatalf("%d live segments, want 50000", u.Len())
	}
	// The second pass overwrote each sector in place: the mappings and the
	// data file are those of the first.
	got := u.Lookup(nil, 10, 3)
	if len(got) != 2 || got[0].Offset != 10 || got[1].Offset != 12 || got[0].MOffset != 8+5 || got[1].MOffset != 8+6 {
		t.Fatalf("lookup after overrides: %+v", got)
	}
	if st, err := os.Stat(filepath.Join(dir, "d")); err != nil || st.Size() != (8+50_000)*512 {
		t.Fatalf("data file after overrides: %v %v, want %d bytes", st.Size(), err, (8+50_000)*512)
	}
}

// TestCommitDetectsZeroBlocks: zeros written as data are committed as
// zeroed mappings (no data), and still hide the layer below.
func TestCommitDetectsZeroBlocks(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	base := writerLayer(t)
	lower, err := OpenSealed("base", bytes.NewReader(base), int64(len(base)))
	if err != nil {
		t.Fatal(err)
	}
	u, err := CreateUpper(filepath.Join(dir, "d"), filepath.Join(dir, "i"), uint64(lower.VirtualSize()), lower.UUID())
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	st, _ := NewStack([]*Layer{lower}, u)
	block := make([]byte, 8192)
	copy(block[4096:], bytes.Repeat([]byte{9}, 4096)) // 4 KiB of zeros, then 4 KiB of data
	if _, err := st.WriteAt(block, 0); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	res, err := st.Commit(context.Background(), &out, "zeros")
	if err != nil {
		t.Fatal(err)
	}
	if res.DataSize != 4096 || res.Trailer.ParentUUID != lower.UUID() || res.Trailer.Tag != "zeros" {
		t.Fatalf("commit result %+v", res)
	}
	top, err := OpenSealed("top", bytes.NewReader(out.Bytes()), int64(out.Len()))
	if err != nil {
		t.Fatal(err)
	}
	segs := top.Index().Segments()
	if len(segs) != 2 || !segs[0].Zeroed || segs[0].Length != 8 || segs[1].Zeroed {
		t.Fatalf("committed mappings %+v", segs)
	}
	lw, _ := OpenSealed("base", bytes.NewReader(base), int64(len(base)))
	st2, _ := NewStack([]*Layer{lw, top}, nil)
	got := make([]byte, 8192)
	st2.ReadAt(got, 0)
	if !bytes.Equal(got, block) {
		t.Fatal("zeroed mapping does not hide the lower layer's data")
	}
}

// TestSparseOddSize: a sparse upper whose size is not a multiple of its 4 KiB
// write granularity takes unaligned writes and trims up to its last byte.
func TestSparseOddSize(t *testing.T) {
	t.Parallel()
	const size = 3*4096 + 512
	u, err := CreateSparseUpper(filepath.Join(t.TempDir(), "s"), size, UUID{})
	if err != nil {
		t.Fatal(err)
	}
	st, _ := NewStack(nil, u)
	defer st.Close()
	want := make([]byte, size)
	for _, w := range []struct{ off, n int }{{size - 700, 700}, {100, 1}, {4000, 5000}, {size - 512, 512}} {
		b := bytes.Repeat([]byte{byte(w.n)}, w.n)
		if _, err := st.WriteAt(b, int64(w.off)); err != nil {
			t.Fatalf("write [%d,+%d): %v", w.off, w.n, err)
		}
		copy(want[w.off:], b)
	}
	if err := st.Trim(size-300, 300); err != nil {
		t.Fatal(err)
	}
	clear(want[size-300:])
	got := make([]byte, size)
	if _, err := st.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("odd-size sparse upper: %v", err)
	}
}
