package zfile

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/klauspost/compress/zstd"
)

// bitCRC32C is an independent, bit-at-a-time CRC32C (reflected polynomial
// 0x82F63B78) without pre- or post-inversion: the "raw update" of the spec.
func bitCRC32C(seed uint32, p []byte) uint32 {
	c := seed
	for _, b := range p {
		c ^= uint32(b)
		for range 8 {
			if c&1 != 0 {
				c = c>>1 ^ 0x82F63B78
			} else {
				c >>= 1
			}
		}
	}
	return c
}

func TestCRC32CIsTheRawUpdate(t *testing.T) {
	t.Parallel()
	// The standard CRC-32C check value wraps the raw update in inversions.
	if got := CRC32C(0xffffffff, []byte("123456789")) ^ 0xffffffff; got != 0xE3069283 {
		t.Fatalf("CRC-32C check value %#x, want 0xE3069283", got)
	}
	p := []byte("overlaybd zfile block")
	for _, seed := range []uint32{0, 100007, 0xdeadbeef} {
		if got, want := CRC32C(seed, p), bitCRC32C(seed, p); got != want {
			t.Fatalf("seed %d: %#x, bitwise %#x", seed, got, want)
		}
	}
}

// specHT builds a ZFile header/trailer space by hand from the spec's table.
func specHT(flags, indexOffset, indexSize, orig uint64, indexCRC, blockSize uint32, algo, level uint8, verify bool) []byte {
	b := make([]byte, 512)
	copy(b, "ZFile\x00\x01\x00")
	copy(b[8:], "tuji.yyf@Alibaba")
	binary.LittleEndian.PutUint32(b[24:], 96)
	binary.LittleEndian.PutUint64(b[32:], flags)
	binary.LittleEndian.PutUint64(b[40:], indexOffset)
	binary.LittleEndian.PutUint64(b[48:], indexSize)
	binary.LittleEndian.PutUint64(b[56:], orig)
	binary.LittleEndian.PutUint32(b[64:], indexCRC)
	binary.LittleEndian.PutUint32(b[72:], blockSize)
	b[76], b[77] = algo, level
	if verify {
		b[88] = 1
	}
	if flags&FlagDigest != 0 {
		binary.LittleEndian.PutUint32(b[28:], bitCRC32C(0, b))
	}
	return b
}

func TestHeaderLayout(t *testing.T) {
	t.Parallel()
	want := specHT(FlagData|FlagSealed|FlagDigest, 12345, 7, 28000, 0xabcdef01, 4096, AlgoZstd, 3, true)
	h := Header{Flags: FlagData | FlagSealed | FlagDigest, IndexOffset: 12345, IndexSize: 7, OriginalSize: 28000,
		IndexCRC: 0xabcdef01, BlockSize: 4096, Algorithm: AlgoZstd, Level: 3, Verify: true}
	if got := h.Marshal(); !bytes.Equal(got, want) {
		t.Fatalf("Marshal differs from the hand-built header at byte %d", diff(got, want))
	}
	back, err := ParseHeader(want)
	if err != nil {
		t.Fatal(err)
	}
	if back != h {
		t.Fatalf("parsed %+v, want %+v", back, h)
	}
	want[40] ^= 1 // any change breaks the digest
	if _, err := ParseHeader(want); !errors.Is(err, ErrChecksum) {
		t.Fatalf("corrupted header: %v", err)
	}
}

func diff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// lz4Lit hand-encodes an LZ4 block holding only literals.
func lz4Lit(p []byte) []byte {
	var b []byte
	if n := len(p); n < 15 {
		b = append(b, byte(n<<4))
	} else {
		b = append(b, 0xf0)
		r := n - 15
		for ; r >= 255; r -= 255 {
			b = append(b, 255)
		}
		b = append(b, byte(r))
	}
	return append(b, p...)
}

// TestOpenHandBuiltZFile reads a ZFile assembled by hand: LZ4 literal blocks
// with CRCs, a jump table and a trailer, no header overwrite.
func TestOpenHandBuiltZFile(t *testing.T) {
	t.Parallel()
	raw := make([]byte, 5000)
	for i := range raw {
		raw[i] = byte(i * 7)
	}
	var f bytes.Buffer
	f.Write(specHT(FlagHeader|FlagData, 0, 0, 0, 0, 4096, AlgoLZ4, 0, true))
	var table []byte
	for off := 0; off < len(raw); off += 4096 {
		blk := lz4Lit(raw[off:min(off+4096, len(raw))])
		blk = binary.LittleEndian.AppendUint32(blk, bitCRC32C(100007, blk))
		f.Write(blk)
		table = binary.LittleEndian.AppendUint32(table, uint32(len(blk)))
	}
	indexOffset := f.Len()
	f.Write(table)
	f.Write(specHT(FlagData|FlagSealed|FlagDigest, uint64(indexOffset), 2, 5000, bitCRC32C(0, table), 4096, AlgoLZ4, 0, true))
	file := f.Bytes()
	z, err := Open("hand", bytes.NewReader(file), int64(len(file)))
	if err != nil {
		t.Fatal(err)
	}
	if z.Size() != 5000 || z.Blocks() != 2 {
		t.Fatalf("size %d blocks %d", z.Size(), z.Blocks())
	}
	got := make([]byte, 5000)
	if _, err := z.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, raw) {
		t.Fatal("content differs")
	}
	part := make([]byte, 300)
	if _, err := z.ReadAt(part, 4000); err != nil || !bytes.Equal(part, raw[4000:4300]) {
		t.Fatalf("read across blocks: %v", err)
	}
}

func testData(n int) []byte {
	r := rand.New(rand.NewPCG(uint64(n), 9))
	b := make([]byte, n)
	for i := 0; i < n; {
		// runs of text-like data and random data
		l := min(n-i, 100+r.IntN(3000))
		if r.IntN(2) == 0 {
			for k := range l {
				b[i+k] = "abcdefgh "[r.IntN(9)]
			}
		} else {
			for k := range l {
				b[i+k] = byte(r.Uint32())
			}
		}
		i += l
	}
	return b
}

// TestWriterLayout checks our writer against the spec: header overwrite,
// trailer, jump table crc, block crcs, and that each block is a plain zstd frame.
func TestWriterLayout(t *testing.T) {
	t.Parallel()
	raw := testData(20000)
	path := filepath.Join(t.TempDir(), "z")
	f, _ := os.Create(path)
	if _, err := Compress(context.Background(), f, bytes.NewReader(raw), Options{BlockSize: 4096}); err != nil {
		t.Fatal(err)
	}
	f.Close()
	file, _ := os.ReadFile(path)
	tr, err := ParseHeader(file[len(file)-512:])
	if err != nil {
		t.Fatal(err)
	}
	if tr.Flags != FlagData|FlagSealed|FlagDigest || tr.BlockSize != 4096 || tr.Algorithm != AlgoZstd || tr.Level != 3 || !tr.Verify || tr.OriginalSize != 20000 || tr.IndexSize != 5 {
		t.Fatalf("trailer %+v", tr)
	}
	hd, err := ParseHeader(file[:512])
	if err != nil {
		t.Fatal(err)
	}
	if hd.Flags != FlagHeader|FlagData|FlagHeaderOverwrite|FlagDigest || hd.IndexOffset != tr.IndexOffset {
		t.Fatalf("overwritten header %+v", hd)
	}
	table := file[tr.IndexOffset : tr.IndexOffset+4*tr.IndexSize]
	if int(tr.IndexOffset)+len(table) != len(file)-512 {
		t.Fatal("the trailer does not follow the jump table")
	}
	if bitCRC32C(0, table) != tr.IndexCRC {
		t.Fatal("index_crc mismatch")
	}
	dec, _ := zstd.NewReader(nil)
	defer dec.Close()
	pos := 512
	var out []byte
	for i := range 5 {
		l := int(binary.LittleEndian.Uint32(table[4*i:]))
		blk := file[pos : pos+l-4]
		if bitCRC32C(100007, blk) != binary.LittleEndian.Uint32(file[pos+l-4:]) {
			t.Fatalf("block %d crc", i)
		}
		d, err := dec.DecodeAll(blk, nil)
		if err != nil {
			t.Fatalf("block %d is not a zstd frame: %v", i, err)
		}
		out = append(out, d...)
		pos += l
	}
	if !bytes.Equal(out, raw) {
		t.Fatal("decoded blocks differ from the input")
	}
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	for _, n := range []int{0, 1, 4095, 4096, 100000, 300001} {
		for _, o := range []Options{{}, {BlockSize: 65536}, {Algorithm: AlgoLZ4, BlockSize: 8192}, {NoVerify: true, Level: 9}} {
			raw := testData(n)
			var buf bytes.Buffer
			if _, err := Compress(context.Background(), &buf, bytes.NewReader(raw), o); err != nil {
				t.Fatal(err)
			}
			z, err := Open("mem", bytes.NewReader(buf.Bytes()), int64(buf.Len()))
			if err != nil {
				t.Fatalf("n=%d %+v: %v", n, o, err)
			}
			var out bytes.Buffer
			if err := z.WriteTo(context.Background(), &out); err != nil || !bytes.Equal(out.Bytes(), raw) {
				t.Fatalf("n=%d %+v: WriteTo %v", n, o, err)
			}
			r := rand.New(rand.NewPCG(uint64(n), 1))
			for range 50 {
				if n == 0 {
					break
				}
				off := r.IntN(n)
				l := min(n-off, 1+r.IntN(20000))
				p := make([]byte, l)
				if _, err := z.ReadAt(p, int64(off)); err != nil && err != io.EOF {
					t.Fatal(err)
				}
				if !bytes.Equal(p, raw[off:off+l]) {
					t.Fatalf("n=%d %+v: ReadAt(%d,+%d) differs", n, o, off, l)
				}
			}
		}
	}
}

// TestHostileFiles: truncations and byte flips give errors, never panics or
// wrong data past a checksum.
func TestHostileFiles(t *testing.T) {
	t.Parallel()
	raw := testData(40000)
	var buf bytes.Buffer
	if _, err := Compress(context.Background(), &buf, bytes.NewReader(raw), Options{}); err != nil {
		t.Fatal(err)
	}
	good := buf.Bytes()
	for n := 0; n < len(good); n += 97 {
		if _, err := Open("t", bytes.NewReader(good[:n]), int64(n)); err == nil {
			t.Fatalf("truncated to %d bytes: opened", n)
		}
	}
	r := rand.New(rand.NewPCG(5, 5))
	for range 400 {
		bad := bytes.Clone(good)
		i := r.IntN(len(bad))
		bad[i] ^= byte(1 + r.IntN(255))
		z, err := Open("t", bytes.NewReader(bad), int64(len(bad)))
		if err != nil {
			continue
		}
		var out bytes.Buffer
		if err := z.WriteTo(context.Background(), &out); err == nil && !bytes.Equal(out.Bytes(), raw) {
			t.Fatalf("flip at %d: served wrong data without an error", i)
		}
	}
}

func FuzzParseHeader(f *testing.F) {
	f.Add(specHT(FlagData|FlagSealed|FlagDigest, 600, 1, 100, 0, 4096, 2, 3, true))
	f.Add(specHT(FlagHeader, 0, 0, 0, 0, 0, 0, 0, false))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseHeader(b)
		if err != nil {
			return
		}
		h.Flags |= FlagDigest
		if _, err := ParseHeader(h.Marshal()); err != nil {
			t.Fatalf("re-marshalled header does not parse: %v", err)
		}
	})
}

func FuzzOpen(f *testing.F) {
	for _, o := range []Options{{}, {Algorithm: AlgoLZ4}, {NoVerify: true}} {
		var buf bytes.Buffer
		Compress(context.Background(), &buf, bytes.NewReader(testData(9000)), o)
		f.Add(buf.Bytes())
	}
	// Hostile geometry: sizes near 2^64, more blocks than bytes on disk.
	f.Add(hostileZFile(math.MaxUint64, 0, 0))
	f.Add(hostileZFile(1<<63, 0, 0))
	f.Add(hostileZFile(1000*4096, 1000, 10))
	// ZFiles from the zstd command (streaming frames, compressed jump tables).
	if names, err := filepath.Glob("../lsmt/testdata/foreign/*.zfile"); err == nil {
		for _, n := range names {
			if b, err := os.ReadFile(n); err == nil {
				f.Add(b)
			}
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		z, err := Open("fuzz", bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		// Whatever opens is backed by the file: a non-negative size held by
		// blocks that are on disk (at least a byte each).
		if z.Size() < 0 || int64(z.Blocks()) > int64(len(b)) || z.Size() > int64(z.Blocks())*int64(z.Trailer().BlockSize) {
			t.Fatalf("opened with size %d, %d blocks of %d, from %d bytes", z.Size(), z.Blocks(), z.Trailer().BlockSize, len(b))
		}
		n := min(z.Size(), 1<<20)
		p := make([]byte, n)
		z.ReadAt(p, 0)
		z.ReadAt(p[:min(n, 10)], z.Size()/2)
	})
}
