package memsnap

import (
	"bytes"
	"errors"
	"testing"

	"github.com/agentenv/agentenv/storage/lsmt"
)

// The ExtentWriter lives in storage/lsmt for this package; its behaviour is
// checked here against the layer reader.

type extent struct {
	off  int64
	data []byte // nil: zeroed extent of n bytes
	n    int64
}

func sealExtents(t *testing.T, vs uint64, ext []extent) ([]byte, lsmt.SealResult) {
	t.Helper()
	var buf bytes.Buffer
	xw, err := lsmt.NewExtentWriter(&buf, lsmt.SealOptions{VirtualSize: vs, Message: "x"})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ext {
		if e.data != nil {
			err = xw.WriteData(e.off, e.data)
		} else {
			err = xw.WriteZeroed(e.off, e.n)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	res, err := xw.Close()
	if err != nil {
		t.Fatal(err)
	}
	if res.FileSize != int64(buf.Len()) || res.Trailer.UUID != xw.UUID() {
		t.Fatalf("result %+v for %d bytes", res, buf.Len())
	}
	return buf.Bytes(), res
}

func TestExtentWriterLayer(t *testing.T) {
	t.Parallel()
	const vs = 24 << 20
	long := bytes.Repeat([]byte{0xab, 0xcd, 0xef, 0x01}, 9<<18) // 9 MiB: longer than one mapping (8 MiB - 512)
	ext := []extent{
		{off: 0, data: bytes.Repeat([]byte{1}, 1024)},
		{off: 1024, data: bytes.Repeat([]byte{2}, 512)}, // contiguous: merged with the first
		{off: 4096, n: 8192},
		{off: 1 << 20, data: long},
		{off: 12 << 20, n: 9 << 20}, // zeroed, longer than one mapping
	}
	raw, res := sealExtents(t, vs, ext)
	l, err := lsmt.OpenSealed("ext", bytes.NewReader(raw), int64(len(raw)))
	if err != nil {
		t.Fatal(err)
	}
	if res.DataSize != int64(1536+len(long)) {
		t.Errorf("data size %d, want %d", res.DataSize, 1536+len(long))
	}
	// Over a lower layer of 0xff everywhere, zeroed extents must read as zeros.
	lowerRaw, _ := sealExtents(t, vs, []extent{{off: 0, data: bytes.Repeat([]byte{0xff}, vs)}})
	lower, err := lsmt.OpenSealed("lower", bytes.NewReader(lowerRaw), int64(len(lowerRaw)))
	if err != nil {
		t.Fatal(err)
	}
	st, err := lsmt.NewStackWith([]*lsmt.Layer{lower, l}, nil, lsmt.StackOptions{AllowReparent: true})
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte{0xff}, vs)
	for _, e := range ext {
		if e.data != nil {
			copy(want[e.off:], e.data)
		} else {
			clear(want[e.off : e.off+e.n])
		}
	}
	got := make([]byte, vs)
	if _, err := st.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("stack read differs at %s", firstDiff(got, want))
	}
	empty, _ := sealExtents(t, 4096, nil)
	if _, err := lsmt.OpenSealed("empty", bytes.NewReader(empty), int64(len(empty))); err != nil {
		t.Fatalf("a layer without extents does not open: %v", err)
	}
}

func TestExtentWriterRejects(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		ext  []extent
	}{
		{"unaligned offset", []extent{{off: 100, data: make([]byte, 512)}}},
		{"unaligned length", []extent{{off: 0, data: make([]byte, 100)}}},
		{"empty data", []extent{{off: 0, data: []byte{}}}},
		{"zero-length zeroed", []extent{{off: 0, n: 0}}},
		{"negative offset", []extent{{off: -512, n: 512}}},
		{"overlap", []extent{{off: 0, data: make([]byte, 1024)}, {off: 512, n: 512}}},
		{"out of order", []extent{{off: 4096, n: 512}, {off: 0, data: make([]byte, 512)}}},
		{"past the virtual size", []extent{{off: 8192 - 512, data: make([]byte, 1024)}}},
		{"huge zeroed", []extent{{off: 512, n: 1 << 62}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			xw, err := lsmt.NewExtentWriter(&buf, lsmt.SealOptions{VirtualSize: 8192})
			if err != nil {
				t.Fatal(err)
			}
			var last error
			for _, e := range tc.ext {
				if e.data != nil {
					last = xw.WriteData(e.off, e.data)
				} else {
					last = xw.WriteZeroed(e.off, e.n)
				}
			}
			if !errors.Is(last, lsmt.ErrExtentOrder) {
				t.Fatalf("last extent: %v, want ErrExtentOrder", last)
			}
		})
	}
	if _, err := lsmt.NewExtentWriter(new(bytes.Buffer), lsmt.SealOptions{}); err == nil {
		t.Error("a zero virtual size was accepted")
	}
	var buf bytes.Buffer
	xw, _ := lsmt.NewExtentWriter(&buf, lsmt.SealOptions{VirtualSize: 4096})
	if _, err := xw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := xw.WriteZeroed(0, 512); err == nil {
		t.Error("a write after Close was accepted")
	}
	if _, err := xw.Close(); err == nil {
		t.Error("a second Close was accepted")
	}
}

func TestWrittenPredicate(t *testing.T) {
	t.Parallel()
	cases := []struct {
		entry uint64
		want  bool
	}{
		{0, false},                          // never touched
		{pmPresent | 12345, true},           // anonymous copy-on-write page
		{pmPresent | pmFile | 12345, false}, // the file's page-cache page (read only)
		{pmSwapped | 0x42, true},            // anonymous page in swap
		{pmSwapped | pmFile, false},         // migration entry of a file page
		{1 << 55, false},                    // soft-dirty alone
		{pmPresent | 1<<56 | 1<<55, true},   // exclusively mapped, soft-dirty
	}
	for _, tc := range cases {
		if got := written(tc.entry); got != tc.want {
			t.Errorf("written(%#x) = %v, want %v", tc.entry, got, tc.want)
		}
	}
}
