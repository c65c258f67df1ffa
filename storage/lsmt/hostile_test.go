package lsmt

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/agentenv/agentenv/storage/zfile"
)

// paddedIndexZFile is a ZFile of a sealed layer whose index claims entries
// padding entries: megabytes of index that compress to a few KiB.
func paddedIndexZFile(t testing.TB, entries uint64) []byte {
	t.Helper()
	vs := uint64(1 << 20)
	h := HeaderTrailer{Flags: FlagHeader | FlagData | FlagSealed, VirtualSize: vs, UUID: NewUUID()}
	raw := bytes.NewBuffer(h.Marshal())
	pad := make([]byte, MappingSize)
	EncodeMapping(pad, Segment{Offset: MaxLogicalOff})
	raw.Write(bytes.Repeat(pad, int(entries)))
	tr := h
	tr.Flags = FlagData | FlagSealed
	tr.IndexOffset, tr.IndexSize = HeaderSize, entries
	raw.Write(tr.Marshal())
	var z bytes.Buffer
	if _, err := zfile.Compress(context.Background(), &z, raw, zfile.Options{BlockSize: 64 << 10}); err != nil {
		t.Fatal(err)
	}
	return z.Bytes()
}

// TestTinyZFileHugeIndex: opening costs memory by what is on disk and the
// mappings present, not by the entry count the decompressed trailer claims.
func TestTinyZFileHugeIndex(t *testing.T) {
	b := paddedIndexZFile(t, 2560<<10) // 40 MiB of index
	if len(b) > 32<<10 {
		t.Fatalf("the hostile file is %d bytes; the test wants a tiny one", len(b))
	}
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	l, err := OpenLayerAt("hostile", bytes.NewReader(b), int64(len(b)))
	runtime.ReadMemStats(&m1)
	if err != nil {
		t.Fatalf("a valid (if wasteful) layer does not open: %v", err)
	}
	if l.Index().Len() != 0 || l.RawPadding != 2560<<10 {
		t.Fatalf("%d mappings, %d padding", l.Index().Len(), l.RawPadding)
	}
	if got := m1.TotalAlloc - m0.TotalAlloc; got > 8<<20 {
		t.Fatalf("opening a %d-byte file allocated %d MiB", len(b), got>>20)
	}
}

// FuzzOpenLayerAt opens arbitrary bytes the way an image opens a lower
// (plain LSMT or ZFile), seeded with layers from other tools and with the
// hostile shapes: a tiny ZFile claiming a huge index, and ZFiles whose
// geometry claims more than the file holds.
func FuzzOpenLayerAt(f *testing.F) {
	f.Add(writerLayer(f))
	f.Add(paddedIndexZFile(f, 64<<10))
	for _, c := range corpusFiles {
		if b, err := os.ReadFile(filepath.Join(corpusDir, c.name)); err == nil {
			f.Add(b)
		}
	}
	var z bytes.Buffer
	if _, err := zfile.Compress(context.Background(), &z, bytes.NewReader(writerLayer(f)), zfile.Options{BlockSize: 4096}); err == nil {
		f.Add(z.Bytes())
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := OpenLayerAt("fuzz", bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		if l.FileSize() < 0 || l.VirtualSize() < 0 {
			t.Fatalf("opened with file size %d, virtual size %d", l.FileSize(), l.VirtualSize())
		}
		exercise(l)
	})
}
