package blob

import (
	"container/list"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
)

// CacheOptions configure a Cache.
type CacheOptions struct {
	BlockSize int64 // default 256 KiB
	Capacity  int64 // bytes kept; default 256 MiB
	ReadAhead int   // blocks fetched in one request on sequential misses; default 8
	// Record keeps the order in which blocks were first read (Touched): the
	// working set of a restore, to prefetch on the next one.
	Record bool
	// Budget, when set, is a limit shared with other caches, on top of
	// Capacity.
	Budget *Budget
}

// Cache is an LRU block cache in front of a slow blob. A miss fetches the
// missing blocks of the read in one request (up to the next block cached
// or in flight); a miss right after the previous fetch's last block fetches
// at least ReadAhead blocks. Concurrent misses on the same block share one
// fetch.
type Cache struct {
	b      Blob
	bs     int64
	maxBlk int
	ra     int

	mu       sync.Mutex
	blocks   map[int64]*list.Element
	lru      *list.List
	inflight map[int64]*fetch
	lastMiss int64
	record   bool
	seen     []uint64 // bitset of blocks read (Record)
	touched  []int64  // blocks in the order of their first read (Record)
	budget   *Budget

	hits, misses, fetches atomic.Int64
	ahead                 atomic.Int64 // blocks fetched beyond what a read asked for
	prefetched            atomic.Int64 // blocks a Prefetch fetched
}

type entry struct {
	blk  int64
	data []byte
	item *list.Element // in the budget's LRU (guarded by Budget.mu)
}

type fetch struct {
	done chan struct{}
	data map[int64][]byte
	err  error
}

// NewCache wraps b.
func NewCache(b Blob, opt CacheOptions) *Cache {
	if opt.BlockSize <= 0 {
		opt.BlockSize = 256 << 10
	}
	if opt.Capacity <= 0 {
		opt.Capacity = 256 << 20
	}
	if opt.ReadAhead <= 0 {
		opt.ReadAhead = 8
	}
	c := &Cache{b: b, bs: opt.BlockSize, maxBlk: int(max(opt.Capacity/opt.BlockSize, 1)), ra: opt.ReadAhead,
		blocks: map[int64]*list.Element{}, lru: list.New(), inflight: map[int64]*fetch{}, lastMiss: -2, record: opt.Record,
		budget: opt.Budget}
	if opt.Record {
		c.seen = make([]uint64, ((b.Size()+opt.BlockSize-1)/opt.BlockSize+63)/64)
	}
	return c
}

// BlockSize is the cache's block size.
func (c *Cache) BlockSize() int64 { return c.bs }

func (c *Cache) recordLocked(blk int64) {
	if !c.record || c.seen[blk/64]&(1<<(blk%64)) != 0 {
		return
	}
	c.seen[blk/64] |= 1 << (blk % 64)
	c.touched = append(c.touched, blk)
}

// Touched returns the blocks read so far, in the order of their first read
// (empty unless CacheOptions.Record).
func (c *Cache) Touched() []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int64(nil), c.touched...)
}

// Stats returns hits, misses and remote fetches so far.
func (c *Cache) Stats() (hits, misses, fetches int64) {
	return c.hits.Load(), c.misses.Load(), c.fetches.Load()
}

// BlockCounts say why the blocks of a cache were fetched.
type BlockCounts struct {
	Read       int64 // distinct blocks reads asked for (counted with CacheOptions.Record only)
	ReadAhead  int64 // fetched beyond what reads asked for, on sequential misses
	Prefetched int64 // fetched by Prefetch (a working set) ahead of the reads
}

// Blocks returns the cache's BlockCounts so far.
func (c *Cache) Blocks() BlockCounts {
	c.mu.Lock()
	read := int64(len(c.touched))
	c.mu.Unlock()
	return BlockCounts{Read: read, ReadAhead: c.ahead.Load(), Prefetched: c.prefetched.Load()}
}

// Source returns the blob the cache reads from (a *Verified for a layer
// opened with OpenVerified: its Fetched says from where bytes came).
func (c *Cache) Source() Blob { return c.b }

func (c *Cache) Size() int64  { return c.b.Size() }
func (c *Cache) Name() string { return c.b.Name() }

// Close drops the cached blocks (giving their room back to the budget) and
// closes the source.
func (c *Cache) Close() error {
	c.mu.Lock()
	var all []*entry
	for _, el := range c.blocks {
		all = append(all, el.Value.(*entry))
	}
	c.blocks, c.lru = map[int64]*list.Element{}, list.New()
	c.mu.Unlock()
	c.settle(nil, all)
	return c.b.Close()
}

// ReadAt serves p from cached blocks, fetching the missing ones.
func (c *Cache) ReadAt(p []byte, off int64) (int, error) {
	size := c.b.Size()
	if off < 0 {
		return 0, fmt.Errorf("read blob %s: negative offset", c.b.Name())
	}
	if off >= size {
		return 0, io.EOF
	}
	var eof error
	if int64(len(p)) > size-off {
		p, eof = p[:size-off], io.EOF
	}
	done := 0
	last := (off + int64(len(p)) - 1) / c.bs
	for done < len(p) {
		pos := off + int64(done)
		blk := pos / c.bs
		data, err := c.block(blk, last-blk+1)
		if err != nil {
			return done, err
		}
		in := int(pos - blk*c.bs)
		if in >= len(data) {
			return done, io.ErrUnexpectedEOF
		}
		done += copy(p[done:], data[in:])
	}
	return done, eof
}

// block returns block blk, of which the read needs want blocks on (a miss
// fetches them together).
func (c *Cache) block(blk, want int64) ([]byte, error) {
	c.mu.Lock()
	c.recordLocked(blk)
	if el, ok := c.blocks[blk]; ok {
		c.lru.MoveToFront(el)
		e := el.Value.(*entry)
		c.mu.Unlock()
		c.hits.Add(1)
		if c.budget != nil {
			c.budget.touch(e)
		}
		return e.data, nil
	}
	if f, ok := c.inflight[blk]; ok {
		c.mu.Unlock()
		<-f.done
		if f.err != nil {
			return nil, f.err
		}
		return f.data[blk], nil
	}
	c.misses.Add(1)
	n := min(want, int64(c.maxBlk))
	if blk == c.lastMiss+1 {
		n = max(n, int64(c.ra))
	}
	f, n := c.startLocked(blk, n)
	if n > want {
		c.ahead.Add(n - want)
	}
	c.lastMiss = blk + n - 1
	c.mu.Unlock()
	c.run(f, blk, n)
	if f.err != nil {
		return nil, f.err
	}
	return f.data[blk], nil
}

// startLocked registers one fetch of up to n blocks from blk (which is
// neither cached nor in flight), stopping the window at a block that is
// already present or being fetched, and returns it with its length.
func (c *Cache) startLocked(blk, n int64) (*fetch, int64) {
	nblocks := (c.b.Size() + c.bs - 1) / c.bs
	n = max(min(n, nblocks-blk), 1)
	for k := int64(1); k < n; k++ {
		_, cached := c.blocks[blk+k]
		_, busy := c.inflight[blk+k]
		if cached || busy {
			n = k
			break
		}
	}
	f := &fetch{done: make(chan struct{}), data: map[int64][]byte{}}
	for k := int64(0); k < n; k++ {
		c.inflight[blk+k] = f
	}
	return f, n
}

// run performs a registered fetch: one read of the source, then the blocks
// enter the cache (evicting the least recently used beyond the capacity).
func (c *Cache) run(f *fetch, blk, n int64) {
	c.fetches.Add(1)
	start := blk * c.bs
	buf := make([]byte, min(n*c.bs, c.b.Size()-start))
	if _, err := c.b.ReadAt(buf, start); err != nil && !(err == io.EOF && len(buf) > 0) {
		f.err = fmt.Errorf("fetch blocks [%d,+%d) of %s: %w", blk, n, c.b.Name(), err)
	}
	var added, dropped []*entry
	c.mu.Lock()
	for k := int64(0); k < n; k++ {
		delete(c.inflight, blk+k)
		if f.err != nil {
			continue
		}
		d := buf[k*c.bs : min((k+1)*c.bs, int64(len(buf)))]
		f.data[blk+k] = d
		e := &entry{blk: blk + k, data: d}
		c.blocks[blk+k] = c.lru.PushFront(e)
		added = append(added, e)
	}
	for c.lru.Len() > c.maxBlk {
		el := c.lru.Back()
		c.lru.Remove(el)
		delete(c.blocks, el.Value.(*entry).blk)
		dropped = append(dropped, el.Value.(*entry))
	}
	c.mu.Unlock()
	close(f.done)
	c.settle(added, dropped)
}
