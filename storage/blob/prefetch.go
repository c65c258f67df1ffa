package blob

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
)

// maxPrefetchRun bounds the blocks one prefetch request asks for.
const maxPrefetchRun = 16

// Prefetch fetches the given blocks (a recorded working set, in the order to
// fetch them) that are not cached yet, as runs of consecutive blocks, with
// up to workers requests at once. It returns when all are fetched, the
// first fetch failed, or ctx is done; its goroutines are gone by then.
func (c *Cache) Prefetch(ctx context.Context, blocks []int64, workers int) error {
	nblocks := (c.b.Size() + c.bs - 1) / c.bs
	runs := make(chan [2]int64)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for range max(workers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range runs {
				if err := c.prefetchRun(r[0], r[1]); err != nil {
					mu.Lock()
					first = cmpErr(first, err)
					mu.Unlock()
				}
			}
		}()
	}
	err := feedRuns(ctx, blocks, nblocks, runs, func() bool { mu.Lock(); defer mu.Unlock(); return first != nil })
	close(runs)
	wg.Wait()
	if first != nil {
		return fmt.Errorf("prefetch %s: %w", c.b.Name(), first)
	}
	return err
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// feedRuns groups blocks into runs of consecutive indices and sends them.
func feedRuns(ctx context.Context, blocks []int64, nblocks int64, runs chan<- [2]int64, failed func() bool) error {
	for i := 0; i < len(blocks); {
		start := blocks[i]
		if start < 0 || start >= nblocks {
			return fmt.Errorf("prefetch: block %d out of range (%d blocks)", start, nblocks)
		}
		n := int64(1)
		for i+int(n) < len(blocks) && blocks[i+int(n)] == start+n && n < maxPrefetchRun {
			n++
		}
		i += int(n)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case runs <- [2]int64{start, min(n, nblocks-start)}:
		}
		if failed() {
			return nil
		}
	}
	return nil
}

// prefetchRun fetches the blocks of [blk, blk+n) that are neither cached nor
// in flight.
func (c *Cache) prefetchRun(blk, n int64) error {
	end := blk + n
	for blk < end {
		c.mu.Lock()
		_, cached := c.blocks[blk]
		_, busy := c.inflight[blk]
		if cached || busy {
			c.mu.Unlock()
			blk++
			continue
		}
		f, k := c.startLocked(blk, end-blk)
		c.mu.Unlock()
		c.prefetched.Add(k)
		c.run(f, blk, k)
		if f.err != nil {
			return f.err
		}
		blk += k
	}
	return nil
}

// Working sets: the blocks a restore read, in order, stored next to a layer
// as a hint for the next restore (a wrong hint costs bandwidth, never
// correctness: every block is verified as always). Encoding: "AENVWS01",
// block size (uint32), count (uint32), then each block as the zigzag varint
// of its difference from the previous one.
const wsMagic = "AENVWS01"

// EncodeWorkingSet encodes blocks recorded with blocks of blockSize bytes.
func EncodeWorkingSet(blockSize int64, blocks []int64) []byte {
	out := make([]byte, 16, 16+2*len(blocks))
	copy(out, wsMagic)
	binary.BigEndian.PutUint32(out[8:], uint32(blockSize))
	binary.BigEndian.PutUint32(out[12:], uint32(len(blocks)))
	prev := int64(0)
	for _, b := range blocks {
		out = binary.AppendVarint(out, b-prev)
		prev = b
	}
	return out
}

// ParseWorkingSet decodes a working set read from storage (untrusted) for a
// layer of nblocks blocks of blockSize bytes: every block in range, none
// twice.
func ParseWorkingSet(data []byte, blockSize, nblocks int64) ([]int64, error) {
	bad := func(why string, args ...any) error {
		return fmt.Errorf("parse working set: %s: %w", fmt.Sprintf(why, args...), errBadWorkingSet)
	}
	if len(data) < 16 || string(data[:8]) != wsMagic {
		return nil, bad("not a working set (%d bytes)", len(data))
	}
	if bs := int64(binary.BigEndian.Uint32(data[8:])); bs != blockSize {
		return nil, bad("recorded with %d-byte blocks, the layer is read in %d", bs, blockSize)
	}
	count := int64(binary.BigEndian.Uint32(data[12:]))
	if count > nblocks || count > int64(len(data)-16) { // a varint is at least one byte
		return nil, bad("%d blocks", count)
	}
	seen := make([]uint64, (nblocks+63)/64)
	out := make([]int64, 0, count)
	rest, prev := data[16:], int64(0)
	for range count {
		d, k := binary.Varint(rest)
		if k <= 0 {
			return nil, bad("truncated")
		}
		rest, prev = rest[k:], prev+d
		if prev < 0 || prev >= nblocks || seen[prev/64]&(1<<(prev%64)) != 0 {
			return nil, bad("block %d out of range or repeated", prev)
		}
		seen[prev/64] |= 1 << (prev % 64)
		out = append(out, prev)
	}
	if len(rest) != 0 {
		return nil, bad("%d bytes after the blocks", len(rest))
	}
	return out, nil
}

var errBadWorkingSet = errors.New("bad working set")
