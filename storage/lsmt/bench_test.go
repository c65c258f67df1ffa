package lsmt

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"path/filepath"
	"testing"
)

// BenchmarkStackReadOverhead measures the stack's own cost per 4 KiB read
// (sources in memory, so no syscalls): 4 sealed layers and an empty upper.
func BenchmarkStackReadOverhead(b *testing.B) {
	const size = 64 << 20
	var layers []*Layer
	r := rand.New(rand.NewPCG(1, 1))
	for i := range 4 {
		var segs []Segment
		for off := uint64(0); off < size/SectorSize; off += 8 * uint64(1+r.IntN(16)) {
			if i == 0 || r.IntN(10) == 0 {
				segs = append(segs, Segment{Offset: off, Length: 8, MOffset: 8})
			}
		}
		src := make([]byte, 8192)
		var out bytes.Buffer
		if _, err := WriteSealed(context.Background(), &out, segs, func(uint8) io.ReaderAt { return bytes.NewReader(src) }, SealOptions{VirtualSize: size}); err != nil {
			b.Fatal(err)
		}
		l, err := OpenSealed("mem", bytes.NewReader(out.Bytes()), int64(out.Len()))
		if err != nil {
			b.Fatal(err)
		}
		layers = append(layers, l)
	}
	dir := b.TempDir()
	u, err := CreateUpper(filepath.Join(dir, "d"), filepath.Join(dir, "i"), size, UUID{})
	if err != nil {
		b.Fatal(err)
	}
	st, err := NewStackWith(layers, u, StackOptions{AllowReparent: true}) // unrelated layers
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	buf := make([]byte, 4096)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		st.ReadAt(buf, int64(uint64(i)*2654435761%(size/4096))*4096)
	}
}
