package blob

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
)

// countingBlob is a real in-memory source that counts its reads.
type countingBlob struct {
	bytesBlob
	reads atomic.Int64
}

func (c *countingBlob) ReadAt(p []byte, off int64) (int, error) {
	c.reads.Add(1)
	return c.bytesBlob.ReadAt(p, off)
}

// TestRecordAndPrefetch: a cache records the order of first reads; a fresh
// cache prefetching that working set serves it afterwards without a single
// miss, in fewer requests than blocks (runs of consecutive blocks).
func TestRecordAndPrefetch(t *testing.T) {
	t.Parallel()
	data, tab, _ := layerFixture(t, 64*4096)
	src := &countingBlob{bytesBlob: bytesBlob{name: "l", data: data, size: int64(len(data))}}
	rec := OpenVerified(tab, "l", CacheOptions{Record: true, ReadAhead: 1}, src)
	order := []int64{40, 41, 42, 43, 3, 7, 7, 8, 60, 41}
	buf := make([]byte, 100)
	for _, b := range order {
		if _, err := rec.ReadAt(buf, b*4096+10); err != nil {
			t.Fatal(err)
		}
	}
	want := []int64{40, 41, 42, 43, 3, 7, 8, 60}
	if got := rec.Touched(); !slices.Equal(got, want) {
		t.Fatalf("touched %v, want %v", got, want)
	}
	ws := EncodeWorkingSet(rec.BlockSize(), rec.Touched())
	blocks, err := ParseWorkingSet(ws, 4096, 64)
	if err != nil || !slices.Equal(blocks, want) {
		t.Fatalf("working set round trip: %v, %v", blocks, err)
	}
	src.reads.Store(0)
	fresh := OpenVerified(tab, "l", CacheOptions{ReadAhead: 1}, src)
	if err := fresh.Prefetch(context.Background(), blocks, 3); err != nil {
		t.Fatal(err)
	}
	if r := src.reads.Load(); r != 4 { // runs 40-43, 3, 7-8, 60
		t.Fatalf("prefetch made %d requests, want 4 (one per run)", r)
	}
	if got := fresh.Blocks(); got.Prefetched != int64(len(want)) || got.ReadAhead != 0 {
		t.Fatalf("prefetch counted %+v, want %d blocks prefetched", got, len(want))
	}
	if got := rec.Blocks().Read; got != int64(len(want)) {
		t.Fatalf("the recording cache counts %d blocks read, want %d", got, len(want))
	}
	for _, b := range want {
		got := make([]byte, 4096)
		if _, err := fresh.ReadAt(got, b*4096); err != nil || !bytes.Equal(got, data[b*4096:(b+1)*4096]) {
			t.Fatalf("block %d after prefetch: %v", b, err)
		}
	}
	if _, misses, _ := fresh.Stats(); misses != 0 {
		t.Fatalf("%d misses after prefetching the working set", misses)
	}
	// A prefetch through a source that lies fails, and caches nothing bad.
	corrupt := bytes.Clone(data)
	corrupt[42*4096] ^= 1
	liar := OpenVerified(tab, "l", CacheOptions{}, &bytesBlob{name: "liar", data: corrupt, size: int64(len(data))})
	if err := liar.Prefetch(context.Background(), blocks, 2); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("prefetch from a corrupt source: %v", err)
	}
	if err := fresh.Prefetch(context.Background(), []int64{64}, 1); err == nil {
		t.Fatal("prefetch accepted a block past the end")
	}
}

func TestParseWorkingSetRejects(t *testing.T) {
	t.Parallel()
	good := EncodeWorkingSet(4096, []int64{5, 1, 9})
	cases := map[string][]byte{
		"empty":        nil,
		"magic":        append([]byte("XENVWS01"), good[8:]...),
		"block size":   EncodeWorkingSet(8192, []int64{1}),
		"out of range": EncodeWorkingSet(4096, []int64{10}),
		"negative":     EncodeWorkingSet(4096, []int64{-1}),
		"repeated":     EncodeWorkingSet(4096, []int64{3, 3}),
		"truncated":    good[:len(good)-1],
		"trailing":     append(bytes.Clone(good), 0),
		"count":        append(append(bytes.Clone(good[:12]), 0xff, 0xff, 0xff, 0xff), good[16:]...),
	}
	for name, data := range cases {
		if _, err := ParseWorkingSet(data, 4096, 10); !errors.Is(err, errBadWorkingSet) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func FuzzParseWorkingSet(f *testing.F) {
	f.Add(EncodeWorkingSet(4096, []int64{5, 1, 9}), int64(16))
	f.Add(EncodeWorkingSet(4096, nil), int64(0))
	f.Fuzz(func(t *testing.T, data []byte, nblocks int64) {
		if nblocks < 0 || nblocks > 1<<20 {
			return
		}
		blocks, err := ParseWorkingSet(data, 4096, nblocks)
		if err != nil {
			return
		}
		again, err := ParseWorkingSet(EncodeWorkingSet(4096, blocks), 4096, nblocks)
		if err != nil || !slices.Equal(again, blocks) {
			t.Fatalf("a parsed working set does not survive a round trip: %v", err)
		}
	})
}

// TestMissFetchesTheReadInOneRequest: a read spanning several missing
// blocks (a memory fault's read-around) is one request of exactly those
// blocks, not one block then a read-ahead window; a read that continues
// where the last fetch ended fetches ReadAhead blocks, and the blocks
// beyond what reads asked for are counted.
func TestMissFetchesTheReadInOneRequest(t *testing.T) {
	t.Parallel()
	const bs = 4096
	data := content(64 * bs)
	src := &countingBlob{bytesBlob: bytesBlob{name: "l", data: data, size: int64(len(data))}}
	c := NewCache(src, CacheOptions{BlockSize: bs, ReadAhead: 8})
	read := func(off, n int64) {
		t.Helper()
		p := make([]byte, n)
		if _, err := c.ReadAt(p, off); err != nil || !bytes.Equal(p, data[off:off+n]) {
			t.Fatalf("read [%d,+%d): %v", off, n, err)
		}
	}
	read(10*bs+100, 4*bs) // blocks 10-14
	if src.reads.Load() != 1 || c.Blocks().ReadAhead != 0 {
		t.Fatalf("a cold read of 5 blocks: %d requests (want 1), %d blocks read ahead (want 0)", src.reads.Load(), c.Blocks().ReadAhead)
	}
	read(15*bs, 2*bs) // continues the last fetch: 8 blocks, 6 of them ahead
	if src.reads.Load() != 2 || c.Blocks().ReadAhead != 6 {
		t.Fatalf("a sequential read: %d requests (want 2), %d blocks ahead (want 6)", src.reads.Load(), c.Blocks().ReadAhead)
	}
	read(11*bs, 12*bs) // all cached
	if n := src.reads.Load(); n != 2 {
		t.Fatalf("a cached read made %d requests", n-2)
	}
	// A read with a cached block in its middle: the fetch stops there.
	read(40*bs, bs)
	read(38*bs, 4*bs) // 38-39 fetched together, 40 cached, 41 fetched
	if n := src.reads.Load(); n != 5 {
		t.Fatalf("a read around a cached block: %d requests, want 2", n-3)
	}
}
