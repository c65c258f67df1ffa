package lsmt

import "sync"

// rangeLocks make a widened (read-modify-write) write atomic against every
// other write of the blocks it touches. The disk is cut in granules striped
// over a fixed set of RWMutexes: an aligned write shares the stripes of its
// granules (aligned writes of one block may run together: each replaces whole
// blocks), a widened write holds them exclusively, so no write lands between
// its read of a block and its write-back. Reads take no lock.
type rangeLocks struct {
	m [lockStripes]sync.RWMutex
}

const (
	lockStripes = 64       // one bit each in a uint64 mask
	lockGranule = 64 << 10 // bytes of disk per granule
)

// stripes is the mask of stripes covering the bytes [start, end).
func stripes(start, end int64) uint64 {
	if end <= start {
		return 0
	}
	g0, g1 := start/lockGranule, (end-1)/lockGranule
	if g1-g0+1 >= lockStripes {
		return ^uint64(0)
	}
	var mask uint64
	for g := g0; g <= g1; g++ {
		mask |= 1 << (g % lockStripes)
	}
	return mask
}

// lock takes the stripes of [start, end) in increasing order (so two writes
// never wait on each other crosswise) and returns the unlock.
func (r *rangeLocks) lock(start, end int64, exclusive bool) func() {
	mask := stripes(start, end)
	for i := range lockStripes {
		if mask&(1<<i) == 0 {
			continue
		}
		if exclusive {
			r.m[i].Lock()
		} else {
			r.m[i].RLock()
		}
	}
	return func() {
		for i := range lockStripes {
			if mask&(1<<i) == 0 {
				continue
			}
			if exclusive {
				r.m[i].Unlock()
			} else {
				r.m[i].RUnlock()
			}
		}
	}
}
