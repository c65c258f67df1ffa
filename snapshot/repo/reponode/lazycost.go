package reponode

import (
	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/storage/blob"
)

// LazyCost is what the layer socket's reads of one use of layers cost so
// far, in bytes (blocks of the layers' caches). What a lazy restore
// fetched is Fetched; Read is its demand (what the storage daemon asked
// for: the guest's memory faults with the mount's read-around, its disk
// reads with the kernel's read-ahead), ReadAhead and Prefetched what was
// fetched beyond it: the caches' read-ahead on sequential misses and the
// layers' recorded working sets.
type LazyCost struct {
	Fetched    int64 // from peers and the store
	Read       int64 // distinct blocks the storage daemon read
	ReadAhead  int64 // fetched beyond the daemon's reads on sequential misses
	Prefetched int64 // working-set blocks fetched ahead of the daemon's reads
}

func (c LazyCost) plus(o LazyCost) LazyCost {
	return LazyCost{Fetched: c.Fetched + o.Fetched, Read: c.Read + o.Read,
		ReadAhead: c.ReadAhead + o.ReadAhead, Prefetched: c.Prefetched + o.Prefetched}
}

// LazyCosts returns what lazy reads cost so far by use (repo.UseRootfs,
// repo.UseMemory; both present), the layers still open and those already
// local.
func (n *Node) LazyCosts() map[string]LazyCost {
	out := map[string]LazyCost{repo.UseRootfs: {}, repo.UseMemory: {}}
	ls := n.lazyState()
	if ls == nil {
		return out
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for use, c := range ls.closed {
		out[use] = out[use].plus(c)
	}
	for _, ll := range ls.open {
		select {
		case <-ll.ready:
			if ll.c != nil {
				out[ll.use] = out[ll.use].plus(costOf(ll.c))
			}
		default:
		}
	}
	return out
}

// LazyFetched is the bytes the layer socket fetched from peers and the
// store so far, for every use (what lazy restores cost the network before
// the layers are fetched whole).
func (n *Node) LazyFetched() int64 {
	var total int64
	for _, c := range n.LazyCosts() {
		total += c.Fetched
	}
	return total
}

// costOf is what a layer's verified cache cost so far.
func costOf(c *blob.Cache) LazyCost {
	b := c.Blocks()
	bs := c.BlockSize()
	return LazyCost{Fetched: fetchedBytes(c), Read: b.Read * bs, ReadAhead: b.ReadAhead * bs, Prefetched: b.Prefetched * bs}
}

// fetchedBytes sums the bytes a layer's verified cache read from its
// sources.
func fetchedBytes(c *blob.Cache) int64 {
	v, ok := c.Source().(*blob.Verified)
	if !ok {
		return 0
	}
	bytes, _ := v.Fetched()
	var n int64
	for _, b := range bytes {
		n += b
	}
	return n
}
