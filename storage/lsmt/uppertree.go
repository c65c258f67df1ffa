package lsmt

// The upper's tree of live mappings: lookups and inserts.

// Lookup appends the live mappings that overlap [off, off+n) sectors,
// clipped. Their data stays where they say only while no trim of the range
// frees it and no write reuses the space: a reader of the data uses
// lookupPinned.
func (u *Upper) Lookup(dst []Segment, off, n uint64) []Segment {
	if !u.mapped.Load() {
		return dst
	}
	u.mu.RLock()
	if u.tree.Len() > 0 {
		dst = u.lookupLocked(dst, off, n)
	}
	u.mu.RUnlock()
	return dst
}

// lookupPinned is Lookup for reading the data it maps: when a mapping is to
// data, the current epoch is pinned (pinned true) so the space is not handed
// to another write before the caller's read is done and it calls unpin(g).
func (u *Upper) lookupPinned(dst []Segment, off, n uint64) (segs []Segment, g uint64, pinned bool) {
	if !u.mapped.Load() {
		return dst, 0, false
	}
	u.mu.RLock()
	k := len(dst)
	if u.tree.Len() > 0 {
		dst = u.lookupLocked(dst, off, n)
	}
	if !u.sparse {
		for _, s := range dst[k:] {
			if !s.Zeroed {
				g, pinned = u.pinLocked(), true
				break
			}
		}
	}
	u.mu.RUnlock()
	return dst, g, pinned
}

func (u *Upper) lookupLocked(dst []Segment, off, n uint64) []Segment {
	end := off + n
	u.tree.DescendLessOrEqual(Segment{Offset: off}, func(it Segment) bool {
		if it.End() > off {
			dst = append(dst, it.Clip(off, end))
		}
		return false
	})
	return u.lookupAfter(dst, off, end)
}

// lookupAfter appends the mappings that start in (off, end), clipped.
func (u *Upper) lookupAfter(dst []Segment, off, end uint64) []Segment {
	u.tree.AscendRange(Segment{Offset: off + 1}, Segment{Offset: end}, func(it Segment) bool {
		dst = append(dst, it.Clip(off, end))
		return true
	})
	return dst
}

// insertLocked adds s, cutting whatever it overrides, and appends the
// overridden data's space to freed.
func (u *Upper) insertLocked(s Segment, freed []extent) []extent {
	end := s.End()
	var hits [4]Segment
	hit := hits[:0]
	hit = u.lookupRaw(hit, s.Offset, end)
	for _, h := range hit {
		u.tree.Delete(h)
		if h.Offset < s.Offset {
			u.tree.ReplaceOrInsert(h.Clip(h.Offset, s.Offset))
		}
		if h.End() > end {
			u.tree.ReplaceOrInsert(h.Clip(end, h.End()))
		}
		if c := h.Clip(s.Offset, end); !c.Zeroed {
			freed = append(freed, extent{c.MOffset, uint64(c.Length)})
		}
	}
	u.tree.ReplaceOrInsert(s)
	u.mapped.Store(true)
	u.treeVer++
	return freed
}

// lookupRaw appends the whole (unclipped) segments overlapping [off, end).
func (u *Upper) lookupRaw(dst []Segment, off, end uint64) []Segment {
	u.tree.DescendLessOrEqual(Segment{Offset: off}, func(it Segment) bool {
		if it.End() > off {
			dst = append(dst, it)
		}
		return false
	})
	u.tree.AscendRange(Segment{Offset: off + 1}, Segment{Offset: end}, func(it Segment) bool {
		dst = append(dst, it)
		return true
	})
	return dst
}

// Segments returns a sorted copy of the live mappings.
func (u *Upper) Segments() []Segment {
	u.mu.RLock()
	defer u.mu.RUnlock()
	return u.segmentsLocked()
}

func (u *Upper) segmentsLocked() []Segment {
	out := make([]Segment, 0, u.tree.Len())
	u.tree.Ascend(func(it Segment) bool {
		out = append(out, it)
		return true
	})
	return out
}

// PinnedSegments returns the live mappings and keeps the space of their
// data from being reused until release is called, so a reader of the data
// file (a commit) never reads another range's data there. Writes in place
// may still change it.
func (u *Upper) PinnedSegments() (segs []Segment, release func()) {
	u.mu.RLock()
	defer u.mu.RUnlock()
	segs = u.segmentsLocked()
	if u.sparse {
		return segs, func() {}
	}
	g := u.pinLocked()
	return segs, func() { u.unpin(g) }
}

// Written says whether the upper ever held a mapping (a write, trim or
// write-zeroes since it was created, or one found in its index at open):
// false means every byte still reads through to the lowers.
func (u *Upper) Written() bool { return u.mapped.Load() }

// Len is the number of live mappings.
func (u *Upper) Len() int {
	u.mu.RLock()
	defer u.mu.RUnlock()
	return u.tree.Len()
}
