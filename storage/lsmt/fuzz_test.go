package lsmt

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// writerLayer returns a sealed layer made by our writer with mixed content.
func writerLayer(t testing.TB) []byte {
	t.Helper()
	src := make([]byte, 64<<10)
	for i := range src {
		src[i] = byte(i % 251)
	}
	clear(src[8192:12288])
	segs := []Segment{{Offset: 0, Length: 40, MOffset: 0}, {Offset: 50, Length: 60, MOffset: 40}, {Offset: 120, Length: 8, Zeroed: true}}
	var out bytes.Buffer
	if _, err := WriteSealed(context.Background(), &out, segs, func(uint8) io.ReaderAt { return bytes.NewReader(src) },
		SealOptions{VirtualSize: 128 << 10, Message: "fuzz seed", Zero: ZeroMark}); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// exercise reads a layer the way a block device would, bounded in size.
func exercise(l *Layer) {
	vs := l.VirtualSize()
	buf := make([]byte, 64<<10)
	for off := int64(0); off < min(vs, 1<<20); off += int64(len(buf)) {
		l.ReadAt(buf, off)
	}
	for _, s := range l.Index().Segments() {
		l.ReadAt(buf[:SectorSize], int64(s.Offset)*SectorSize)
	}
}

func FuzzParseHeaderTrailer(f *testing.F) {
	u := NewUUID()
	f.Add((&HeaderTrailer{Flags: FlagData | FlagSealed, IndexOffset: 8192, IndexSize: 256, VirtualSize: 1 << 30, UUID: u, Tag: "x"}).Marshal())
	f.Add(specHeader(3, 0, 0, 4096, testUUID, testParent, "m"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseHeaderTrailer(b)
		if err != nil {
			return
		}
		back, err := ParseHeaderTrailer(h.Marshal())
		if err != nil {
			t.Fatalf("re-marshalled header does not parse: %v", err)
		}
		if back.Flags != h.Flags || back.UUID != h.UUID || back.IndexSize != h.IndexSize || back.VirtualSize != h.VirtualSize {
			t.Fatalf("round trip changed fields: %+v vs %+v", back, h)
		}
	})
}

func FuzzMapping(f *testing.F) {
	f.Add(make([]byte, 16))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < MappingSize {
			return
		}
		s := DecodeMapping(b)
		enc := make([]byte, MappingSize)
		EncodeMapping(enc, s)
		if DecodeMapping(enc) != s {
			t.Fatalf("mapping round trip changed %+v", s)
		}
	})
}

func FuzzOpenSealed(f *testing.F) {
	f.Add(writerLayer(f))
	f.Add(handSealed(f, 64<<10))
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := OpenSealed("fuzz", bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		exercise(l)
	})
}

// FuzzUpperIndex feeds arbitrary index-file tails (after a valid header) to
// the writable layer's loader and checks nothing points outside the data.
func FuzzUpperIndex(f *testing.F) {
	ent := make([]byte, 16)
	EncodeMapping(ent, Segment{Offset: 1, Length: 2, MOffset: 8})
	f.Add(ent)
	f.Add(append(bytes.Clone(ent), 1, 2, 3))
	dir := f.TempDir()
	data := append(specHeader(3, 0, 0, 64<<10, testUUID, "", ""), bytes.Repeat([]byte{7}, 8192)...)
	dp := filepath.Join(dir, "data")
	if err := os.WriteFile(dp, data, 0o644); err != nil {
		f.Fatal(err)
	}
	hdr := specHeader(1, 4096, 0, 64<<10, testUUID, "", "")
	f.Fuzz(func(t *testing.T, tail []byte) {
		ip := filepath.Join(t.TempDir(), "index")
		if err := os.WriteFile(ip, append(bytes.Clone(hdr), tail...), 0o644); err != nil {
			t.Fatal(err)
		}
		u, err := OpenUpper(dp, ip, true)
		if err != nil {
			return
		}
		defer u.Close()
		for _, s := range u.Segments() {
			if s.End() > 128 || (!s.Zeroed && s.MOffset+uint64(s.Length) > uint64(len(data)/SectorSize)) {
				t.Fatalf("accepted mapping %+v outside the layer", s)
			}
		}
		st, _ := NewStack(nil, u)
		buf := make([]byte, 64<<10)
		if _, err := st.ReadAt(buf, 0); err != nil {
			t.Fatalf("read of an accepted upper failed: %v", err)
		}
	})
}

// TestHostileLayers: every truncation and many byte flips of a valid layer
// give an error or a layer that reads without panicking.
func TestHostileLayers(t *testing.T) {
	t.Parallel()
	good := writerLayer(t)
	for n := 0; n < len(good); n += 61 {
		if _, err := OpenSealed("t", bytes.NewReader(good[:n]), int64(n)); err == nil {
			t.Fatalf("truncated to %d bytes: opened", n)
		}
	}
	r := rand.New(rand.NewPCG(7, 7))
	hot := []int{28, 32, 40, 48, 56, 93} // header fields
	for range 2000 {
		bad := bytes.Clone(good)
		var i int
		switch r.IntN(3) {
		case 0: // the index
			i = len(bad) - 4096 - 4096 + r.IntN(4096)
		case 1: // the trailer's fields
			i = len(bad) - 4096 + hot[r.IntN(len(hot))] + r.IntN(8)
		default:
			i = r.IntN(len(bad))
		}
		if i < 0 || i >= len(bad) {
			continue
		}
		bad[i] ^= byte(1 + r.IntN(255))
		l, err := OpenSealed("t", bytes.NewReader(bad), int64(len(bad)))
		if err != nil {
			continue
		}
		exercise(l)
	}
}

// TestUpperOpenErrors: broken writable layers are refused with the file named.
func TestUpperOpenErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	u, err := CreateUpper(filepath.Join(dir, "d"), filepath.Join(dir, "i"), 1<<20, UUID{})
	if err != nil {
		t.Fatal(err)
	}
	u.Close()
	other, _ := CreateUpper(filepath.Join(dir, "d2"), filepath.Join(dir, "i2"), 1<<20, UUID{})
	other.Close()
	os.WriteFile(filepath.Join(dir, "short"), []byte("LSMT"), 0o644)
	cases := map[string][2]string{
		"uuid mismatch":  {"d", "i2"},
		"short index":    {"d", "short"},
		"short data":     {"short", "i"},
		"index as data":  {"i", "d"},
		"missing index":  {"d", "nope"},
		"sparse without": {"d", ""},
	}
	for name, c := range cases {
		ip := c[1]
		if ip != "" {
			ip = filepath.Join(dir, ip)
		}
		_, err := OpenUpper(filepath.Join(dir, c[0]), ip, true)
		if err == nil {
			t.Errorf("%s: opened", name)
			continue
		}
		if !bytes.Contains([]byte(err.Error()), []byte(dir)) {
			t.Errorf("%s: error %q does not name the file", name, err)
		}
	}
}
