package daemon

import "sync"

// idAllocator hands out the smallest free device id, so ids (and the socket
// paths derived from them) stay small and are reused after delete. Reuse is
// safe because every export also carries a random nonce in its name.
type idAllocator struct {
	mu   sync.Mutex
	used map[uint32]bool
	max  uint32
}

func newIDAllocator(max uint32) *idAllocator {
	return &idAllocator{used: make(map[uint32]bool), max: max}
}

// alloc returns the smallest free id, or false when all max ids are in use.
func (a *idAllocator) alloc() (uint32, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id := uint32(0); id < a.max; id++ {
		if !a.used[id] {
			a.used[id] = true
			return id, true
		}
	}
	return 0, false
}

// reserve marks an id found in the state directory as used.
func (a *idAllocator) reserve(id uint32) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.used[id] || id >= a.max {
		return false
	}
	a.used[id] = true
	return true
}

func (a *idAllocator) free(id uint32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.used, id)
}
