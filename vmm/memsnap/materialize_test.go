package memsnap

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/storage/lsmt"
	"github.com/agentenv/agentenv/storage/zfile"
)

// TestMaterializeErrors feeds broken stacks; each must fail without touching
// an existing file under the output name or leaving a temporary behind.
func TestMaterializeErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	memFile := filepath.Join(dir, "mem")
	writeMemFile(t, memFile, 16, 1, []int64{0, 5, 9})
	good := filepath.Join(dir, "good.lsmt")
	if _, err := ImportFull(ctx, memFile, good, ""); err != nil {
		t.Fatal(err)
	}
	orig := readFile(t, good)
	l, err := lsmt.OpenLayerFile(good)
	if err != nil {
		t.Fatal(err)
	}
	indexOff := int64(l.Trailer.IndexOffset)
	l.Close()
	corrupt := func(name string, edit func(b []byte) []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, edit(bytes.Clone(orig)), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	truncated := corrupt("truncated", func(b []byte) []byte { return b[:len(b)-lsmt.HeaderSize] })
	badTrailer := corrupt("badtrailer", func(b []byte) []byte { b[len(b)-lsmt.HeaderSize] ^= 0xff; return b })
	badIndex := corrupt("badindex", func(b []byte) []byte {
		lsmt.EncodeMapping(b[indexOff:], lsmt.Segment{Offset: 1 << 40, MOffset: 8, Length: 8}) // past the virtual size
		return b
	})
	wildData := corrupt("wilddata", func(b []byte) []byte {
		lsmt.EncodeMapping(b[indexOff:], lsmt.Segment{Offset: 0, MOffset: 1 << 30, Length: 8}) // data outside the file
		return b
	})
	notLayer := corrupt("notlayer", func(b []byte) []byte { return bytes.Repeat([]byte{7}, 3*lsmt.HeaderSize) })
	cases := []struct {
		name   string
		layers []string
	}{
		{"no layers", nil},
		{"missing layer", []string{good, filepath.Join(dir, "missing")}},
		{"truncated layer", []string{good, truncated}},
		{"corrupted trailer", []string{badTrailer}},
		{"index past the virtual size", []string{good, badIndex}},
		{"index pointing outside the data", []string{wildData}},
		{"not a layer", []string{notLayer, good}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(dir, "out-"+tc.name)
			if err := os.WriteFile(out, []byte("previous"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := Materialize(ctx, tc.layers, out); err == nil {
				t.Fatal("Materialize succeeded")
			}
			if got := readFile(t, out); string(got) != "previous" {
				t.Errorf("the existing output was replaced by %d bytes", len(got))
			}
			noTemp(t, out)
		})
	}
	t.Run("canceled", func(t *testing.T) {
		c, cancel := context.WithCancel(ctx)
		cancel()
		out := filepath.Join(dir, "canceled")
		if err := Materialize(c, []string{good}, out); !errors.Is(err, context.Canceled) {
			t.Fatalf("Materialize: %v, want context.Canceled", err)
		}
		noTemp(t, out)
	})
}

// TestMaterializeReplacesAtomically: a mapped old file keeps its contents
// when Materialize writes a new one under the same name.
func TestMaterializeReplaces(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	ca := writeMemFile(t, a, 8, 1, []int64{1, 2})
	cb := writeMemFile(t, b, 8, 2, []int64{3})
	la, lb := filepath.Join(dir, "a.lsmt"), filepath.Join(dir, "b.lsmt")
	for src, dst := range map[string]string{a: la, b: lb} {
		if _, err := ImportFull(ctx, src, dst, ""); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "out")
	if err := Materialize(ctx, []string{la}, out); err != nil {
		t.Fatal(err)
	}
	old, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := Materialize(ctx, []string{lb}, out); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, out); !bytes.Equal(got, cb) {
		t.Fatalf("new output differs at %s", firstDiff(got, cb))
	}
	got := make([]byte, len(ca))
	if _, err := old.ReadAt(got, 0); err != nil || !bytes.Equal(got, ca) {
		t.Fatalf("the old file changed under an open reader (%v)", err)
	}
}

func TestLayerUUID(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := filepath.Join(dir, "l")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	want := lsmt.NewUUID()
	xw, err := lsmt.NewExtentWriter(f, lsmt.SealOptions{VirtualSize: 4096, UUID: want})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := xw.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if got, err := LayerUUID(p); err != nil || got != want {
		t.Fatalf("LayerUUID = %s, %v; want %s", got, err, want)
	}
	if _, err := LayerUUID(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("LayerUUID of a missing file succeeded")
	}
}

// TestMaterializeStacks covers stacks whose layers differ in size, a
// compressed (ZFile) layer, and layers with zero data inside data extents
// (as other tools may write them).
func TestMaterializeStacks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	page := func(v byte) []byte { return bytes.Repeat([]byte{v}, int(ps)) }
	seal := func(name string, vs int64, ext func(xw *lsmt.ExtentWriter) error) string {
		p := filepath.Join(dir, name)
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		xw, err := lsmt.NewExtentWriter(f, lsmt.SealOptions{VirtualSize: uint64(vs)})
		if err != nil {
			t.Fatal(err)
		}
		if err := ext(xw); err != nil {
			t.Fatal(err)
		}
		if _, err := xw.Close(); err != nil {
			t.Fatal(err)
		}
		return p
	}
	big := seal("big", 16*ps, func(xw *lsmt.ExtentWriter) error {
		return xw.WriteData(0, bytes.Repeat([]byte{1}, int(16*ps)))
	})
	small := seal("small", 8*ps, func(xw *lsmt.ExtentWriter) error {
		if err := xw.WriteData(2*ps, page(2)); err != nil {
			return err
		}
		return xw.WriteZeroed(4*ps, ps)
	})
	zeroData := seal("zerodata", 16*ps, func(xw *lsmt.ExtentWriter) error {
		return xw.WriteData(ps, append(page(0), page(3)...)) // a zero page stored as data
	})
	compressed := filepath.Join(dir, "small.zfile")
	func() {
		src, err := os.Open(small)
		if err != nil {
			t.Fatal(err)
		}
		defer src.Close()
		dst, err := os.Create(compressed)
		if err != nil {
			t.Fatal(err)
		}
		defer dst.Close()
		if _, err := zfile.Compress(ctx, dst, src, zfile.Options{}); err != nil {
			t.Fatal(err)
		}
	}()
	want := func(size int64, pages map[int64]byte) []byte {
		b := make([]byte, size)
		for p, v := range pages {
			copy(b[p*ps:], page(v))
		}
		return b
	}
	ones := map[int64]byte{}
	for p := range int64(16) {
		ones[p] = 1
	}
	cases := []struct {
		name   string
		layers []string
		want   []byte
		holes  []int64
	}{
		{"smaller top cuts the size", []string{big, small}, want(8*ps, map[int64]byte{0: 1, 1: 1, 2: 2, 3: 1, 5: 1, 6: 1, 7: 1}), []int64{4}},
		{"larger top keeps the lower", []string{small, big}, want(16*ps, ones), nil},
		{"compressed layer", []string{big, compressed}, want(8*ps, map[int64]byte{0: 1, 1: 1, 2: 2, 3: 1, 5: 1, 6: 1, 7: 1}), []int64{4}},
		{"zero data stays a hole", []string{zeroData}, want(16*ps, map[int64]byte{2: 3}), []int64{0, 1, 3, 15}},
		{"zero data hides the lower", []string{big, zeroData}, want(16*ps, map[int64]byte{0: 1, 2: 3, 3: 1, 4: 1, 5: 1, 6: 1, 7: 1, 8: 1, 9: 1, 10: 1, 11: 1, 12: 1, 13: 1, 14: 1, 15: 1}), []int64{1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(dir, "out-"+tc.name)
			if err := Materialize(ctx, tc.layers, out); err != nil {
				t.Fatal(err)
			}
			if got := readFile(t, out); !bytes.Equal(got, tc.want) {
				t.Fatalf("materialized differs at %s", firstDiff(got, tc.want))
			}
			for _, p := range tc.holes {
				if !isHole(t, out, p) {
					t.Errorf("page %d is not a hole", p)
				}
			}
		})
	}
}
