package blob

import (
	"container/list"
	"sync"
)

// Budget is a size limit shared by several caches (a node's block cache
// for every remote layer it reads): when their blocks together pass it, the
// least recently used block of any of them goes, so hot layers stay and cold
// ones make room. A cache never calls into the budget while holding its own
// lock, and the budget never locks a cache while holding its lock, so caches
// sharing one cannot deadlock.
type Budget struct {
	mu   sync.Mutex
	max  int64
	used int64
	lru  *list.List // of *budgetItem, most recent first
}

type budgetItem struct {
	c *Cache
	e *entry
}

// NewBudget returns a budget of max bytes.
func NewBudget(max int64) *Budget { return &Budget{max: max, lru: list.New()} }

// Used returns the bytes the caches sharing b hold now.
func (b *Budget) Used() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// add accounts for new blocks of c and returns those (of any cache) that
// must go to stay within the limit.
func (b *Budget) add(c *Cache, es []*entry) []budgetItem {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, e := range es {
		e.item = b.lru.PushFront(budgetItem{c: c, e: e})
		b.used += int64(len(e.data))
	}
	var victims []budgetItem
	for b.used > b.max && b.lru.Len() > 0 {
		el := b.lru.Back()
		it := el.Value.(budgetItem)
		b.lru.Remove(el)
		it.e.item = nil
		b.used -= int64(len(it.e.data))
		victims = append(victims, it)
	}
	return victims
}

// touch marks a block as just used.
func (b *Budget) touch(e *entry) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e.item != nil {
		b.lru.MoveToFront(e.item)
	}
}

// remove forgets blocks a cache dropped by itself.
func (b *Budget) remove(es []*entry) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, e := range es {
		if e.item != nil {
			b.lru.Remove(e.item)
			e.item = nil
			b.used -= int64(len(e.data))
		}
	}
}

// evictEntry drops e from c if it is still there (the budget chose it).
func (c *Cache) evictEntry(e *entry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.blocks[e.blk]; ok && el.Value.(*entry) == e {
		c.lru.Remove(el)
		delete(c.blocks, e.blk)
	}
}

// settle hands the blocks a fetch added and those the cache's own limit
// evicted to the budget, and evicts what the budget says must go. Called
// without c.mu.
func (c *Cache) settle(added, dropped []*entry) {
	if c.budget == nil {
		return
	}
	// Add first: a block the cache's own limit dropped in the same fetch
	// then leaves the budget again with the others.
	victims := c.budget.add(c, added)
	c.budget.remove(dropped)
	for _, v := range victims {
		v.c.evictEntry(v.e)
	}
}
