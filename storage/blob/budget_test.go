package blob

import (
	"sync"
	"testing"
)

// TestBudgetShared: two caches under one budget of 4 blocks hold at most 4
// together, the least recently used block of either goes first, a hot block
// stays, and closing a cache gives its room back.
func TestBudgetShared(t *testing.T) {
	t.Parallel()
	data, tab, _ := layerFixture(t, 16*4096)
	budget := NewBudget(4 * 4096)
	open := func() *Cache {
		return OpenVerified(tab, "l", CacheOptions{ReadAhead: 1, Budget: budget},
			&bytesBlob{name: "l", data: data, size: int64(len(data))})
	}
	a, b := open(), open()
	read := func(c *Cache, blk int64) {
		t.Helper()
		if _, err := c.ReadAt(make([]byte, 10), blk*4096); err != nil {
			t.Fatal(err)
		}
	}
	read(a, 0)
	read(a, 1)
	read(a, 2)
	read(b, 5)
	read(a, 0) // hot: moves to the front
	read(b, 6) // over the budget: a's block 1 is the least recently used
	if used := budget.Used(); used != 4*4096 {
		t.Fatalf("budget holds %d bytes, want %d", used, 4*4096)
	}
	_, missesA, _ := a.Stats()
	read(a, 0)
	if _, m, _ := a.Stats(); m != missesA {
		t.Fatal("the hot block was evicted")
	}
	read(a, 1)
	if _, m, _ := a.Stats(); m != missesA+1 {
		t.Fatal("the least recently used block was not the one evicted")
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if used := budget.Used(); used > 4*4096 || used != int64(len(a.blocks))*4096 {
		t.Fatalf("after closing b the budget holds %d bytes, a %d blocks", used, len(a.blocks))
	}
	// Concurrent readers of caches sharing a budget stay within it.
	var wg sync.WaitGroup
	caches := []*Cache{a, open(), open()}
	for i, c := range caches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range 200 {
				if _, err := c.ReadAt(make([]byte, 100), int64((k*7+i)%16)*4096); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	held := 0
	for _, c := range caches {
		c.mu.Lock()
		held += len(c.blocks)
		c.mu.Unlock()
	}
	if used := budget.Used(); used > 4*4096 || used != int64(held)*4096 {
		t.Fatalf("budget says %d bytes, the caches hold %d blocks", used, held)
	}
}
