package memsnap

import (
	"bytes"
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/storage/lsmt"
	"github.com/agentenv/agentenv/vmm/memsnap/memsnaptest"
)

// sealPages writes a sealed layer of vs bytes at path holding Pattern(seed)
// at the given pages, and returns what the layer reads as.
func sealPages(t *testing.T, path string, vs int64, seed uint64, pages []int64) map[int64][]byte {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	xw, err := lsmt.NewExtentWriter(f, lsmt.SealOptions{VirtualSize: uint64(vs)})
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64][]byte{}
	for _, p := range pages {
		b := make([]byte, ps)
		memsnaptest.Pattern(b, seed, p)
		if err := xw.WriteData(p*ps, b); err != nil {
			t.Fatal(err)
		}
		out[p] = b
	}
	if _, err := xw.Close(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPackCarriesTheStacksBytes: a pack of a two-layer stack holds, for
// each extent of the working set, exactly the bytes the stack reads there
// (the upper layer's where it wrote, the lower's elsewhere, zeros in
// holes), and ReadPack finds them where they are.
func TestPackCarriesTheStacksBytes(t *testing.T) {
	dir := t.TempDir()
	const pages = 64
	vs := pages * ps
	lower := filepath.Join(dir, "lower")
	upper := filepath.Join(dir, "upper")
	want := make([]byte, vs)
	for p, b := range sealPages(t, lower, vs, 1, []int64{0, 1, 2, 3, 10, 11, 40}) {
		copy(want[p*ps:], b)
	}
	for p, b := range sealPages(t, upper, vs, 2, []int64{1, 11, 12, 63}) {
		copy(want[p*ps:], b)
	}
	extents := []Extent{{Off: 0, Len: 4 * ps}, {Off: 10 * ps, Len: 3 * ps}, {Off: 20 * ps, Len: ps}, {Off: 63 * ps, Len: ps}}
	ws, err := encodeWorkingSet(vs, extents)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	n, err := WritePack(context.Background(), &buf, []string{lower, upper}, ws)
	if err != nil || n != Bytes(extents) {
		t.Fatalf("WritePack: %d bytes, %v; want %d", n, err, Bytes(extents))
	}
	p, err := ReadPack(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	if p.Size != vs || len(p.Extents) != len(extents) {
		t.Fatalf("pack of %d bytes with %d extents, want %d and %d", p.Size, len(p.Extents), vs, len(extents))
	}
	off := p.DataOff
	for _, e := range p.Extents {
		got := buf.Bytes()[off : off+e.Len]
		if !bytes.Equal(got, want[e.Off:e.Off+e.Len]) {
			t.Fatalf("extent %d+%d: %s", e.Off, e.Len, firstDiff(got, want[e.Off:e.Off+e.Len]))
		}
		off += e.Len
	}

	// A working set of another file's size is refused.
	other, _ := encodeWorkingSet(2*vs, extents)
	if _, err := WritePack(context.Background(), &bytes.Buffer{}, []string{lower, upper}, other); err == nil {
		t.Fatal("a pack for a working set of another size was written")
	}
}

// TestPackCut: a working set larger than MaxPackData is cut to it.
func TestPackCut(t *testing.T) {
	dir := t.TempDir()
	vs := int64(2 * MaxPackData)
	l := filepath.Join(dir, "l")
	sealPages(t, l, vs, 3, []int64{0})
	ws, _ := encodeWorkingSet(vs, []Extent{{Off: 0, Len: vs}})
	var buf bytes.Buffer
	n, err := WritePack(context.Background(), &buf, []string{l}, ws)
	if err != nil || n != MaxPackData {
		t.Fatalf("WritePack: %d bytes, %v; want %d", n, err, MaxPackData)
	}
	if _, err := ReadPack(bytes.NewReader(buf.Bytes()), int64(buf.Len())); err != nil {
		t.Fatal(err)
	}
}

// TestReadPackRefuses: packs that lie about their contents are refused.
func TestReadPackRefuses(t *testing.T) {
	ws, _ := encodeWorkingSet(8*ps, []Extent{{Off: 0, Len: ps}})
	good := packOf(ws, make([]byte, ps))
	if _, err := ReadPack(bytes.NewReader(good), int64(len(good))); err != nil {
		t.Fatalf("a good pack: %v", err)
	}
	cases := map[string][]byte{
		"short":         good[:10],
		"magic":         append([]byte("XXXXXXXX"), good[8:]...),
		"truncated":     good[:len(good)-1],
		"trailing":      append(bytes.Clone(good), 0),
		"length":        packOf(ws, make([]byte, ps))[:16],
		"bad ws":        packOf([]byte(`{"size":-1}`), nil),
		"huge ws len":   lenLies(good, 1<<40),
		"ws len > file": lenLies(good, uint64(len(good))),
	}
	for name, b := range cases {
		if _, err := ReadPack(bytes.NewReader(b), int64(len(b))); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func packOf(ws, data []byte) []byte {
	var b bytes.Buffer
	_ = writePackHeader(&b, ws)
	b.Write(data)
	return b.Bytes()
}

func lenLies(p []byte, n uint64) []byte {
	out := bytes.Clone(p)
	binary.BigEndian.PutUint64(out[8:], n)
	return out
}

// FuzzReadPack: whatever a pack holds, parsing it never panics, and what
// it accepts covers the pack exactly, inside the memory file it names.
func FuzzReadPack(f *testing.F) {
	ws, _ := encodeWorkingSet(8*ps, []Extent{{Off: 0, Len: ps}, {Off: 4 * ps, Len: 2 * ps}})
	f.Add(packOf(ws, make([]byte, 3*ps)))
	f.Add(packOf([]byte(`{"size":9223372036854775807,"extents":[{"off":0,"len":9223372036854775807},{"off":0,"len":9223372036854775807}]}`), nil))
	f.Add([]byte("AENVWSP1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ReadPack(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		if n := Bytes(p.Extents); n > MaxPackData || p.DataOff+n != int64(len(b)) {
			t.Fatalf("accepted %d bytes of extents at %d in a %d-byte pack", n, p.DataOff, len(b))
		}
		for _, e := range p.Extents {
			if e.Off < 0 || e.Len <= 0 || e.Off+e.Len > p.Size {
				t.Fatalf("extent %d+%d of a %d-byte file accepted", e.Off, e.Len, p.Size)
			}
		}
	})
}
