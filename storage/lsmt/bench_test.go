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

// BenchmarkUpperWrite measures 4 KiB writes to a log-structured upper (on
// tmpfs when there is one, so the figures are the upper's own cost): into
// holes (each write gets new space), over data the upper holds (in place),
// and the same from parallel writers (the locking).
func BenchmarkUpperWrite(b *testing.B) {
	const size = 64 << 20
	buf := bytes.Repeat([]byte{0x5a}, 4096)
	newUpper := func(b *testing.B) *Upper {
		dir, err := os.MkdirTemp(tmpBase(), "lsmt-bench-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(dir) })
		u, err := CreateUpper(filepath.Join(dir, "d"), filepath.Join(dir, "i"), size, UUID{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { u.Close() })
		return u
	}
	filled := func(b *testing.B) *Upper {
		u := newUpper(b)
		for off := int64(0); off < size; off += 4096 {
			if _, err := u.WriteAt(buf, off); err != nil {
				b.Fatal(err)
			}
		}
		return u
	}
	b.Run("holes", func(b *testing.B) {
		u := newUpper(b)
		b.SetBytes(4096)
		b.ReportAllocs()
		for i := range b.N {
			off := int64(i) * 4096 % size
			if off == 0 && i > 0 {
				b.StopTimer()
				u = newUpper(b)
				b.StartTimer()
			}
			if _, err := u.WriteAt(buf, off); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("overwrite", func(b *testing.B) {
		u := filled(b)
		b.SetBytes(4096)
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			if _, err := u.WriteAt(buf, int64(uint64(i)*2654435761%(size/4096))*4096); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("overwrite-parallel", func(b *testing.B) {
		u := filled(b)
		b.SetBytes(4096)
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			r := rand.New(rand.NewPCG(rand.Uint64(), 0))
			for pb.Next() {
				if _, err := u.WriteAt(buf, r.Int64N(size/4096)*4096); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// BenchmarkUpperRead measures 4 KiB reads of data an upper holds (on tmpfs
// when there is one): the lookup and the pin that keeps the space from
// being reused under the read, then the read itself.
func BenchmarkUpperRead(b *testing.B) {
	const size = 64 << 20
	dir, err := os.MkdirTemp(tmpBase(), "lsmt-bench-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	u, err := CreateUpper(filepath.Join(dir, "d"), filepath.Join(dir, "i"), size, UUID{})
	if err != nil {
		b.Fatal(err)
	}
	st, err := NewStack(nil, u)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	buf := bytes.Repeat([]byte{0x5a}, 4096)
	for off := int64(0); off < size; off += 4096 {
		if _, err := u.WriteAt(buf, off); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(4096)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		r := rand.New(rand.NewPCG(rand.Uint64(), 0))
		p := make([]byte, 4096)
		for pb.Next() {
			if _, err := st.ReadAt(p, r.Int64N(size/4096)*4096); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
