package lsmt

import (
	"log/slog"

	"github.com/google/btree"
)

// The space of a log-structured upper's data file. Every sector in
// [HeaderSize, dataEnd) is, at any moment, exactly one of: mapped by a live
// mapping of the tree; allocated to a write in flight (not yet mapped); or
// unreferenced, in one of the sets of spaceState, which says when it may be
// handed to a new write (see reclaim.go). A write over data the upper holds
// is done in place; only the pieces of a write that the upper does not hold
// as data get space, from the free extents first (best fit, else the largest
// ones), and the data file grows only when they do not suffice.

// extent is a range of physical sectors of the data file.
type extent struct{ start, n uint64 }

func (e extent) end() uint64 { return e.start + e.n }

// freeExtents is a set of disjoint, non-adjacent extents, indexed by start
// (to merge neighbours) and by size (to find a fit).
type freeExtents struct {
	byStart *btree.BTreeG[extent]
	bySize  *btree.BTreeG[extent]
	total   uint64 // sectors
}

func newFreeExtents() freeExtents {
	return freeExtents{
		byStart: btree.NewG[extent](32, func(a, b extent) bool { return a.start < b.start }),
		bySize: btree.NewG[extent](32, func(a, b extent) bool {
			return a.n < b.n || (a.n == b.n && a.start < b.start)
		}),
	}
}

func (f *freeExtents) insert(e extent) {
	f.byStart.ReplaceOrInsert(e)
	f.bySize.ReplaceOrInsert(e)
	f.total += e.n
}

func (f *freeExtents) remove(e extent) {
	f.byStart.Delete(e)
	f.bySize.Delete(e)
	f.total -= e.n
}

// add returns e to the set, merged with the extents it touches. An e that
// overlaps free space is a bug (the same sectors freed twice): it is dropped
// and logged rather than added, so the sectors are never handed to two writes.
func (f *freeExtents) add(e extent) {
	if e.n == 0 {
		return
	}
	prev, hasPrev := f.atOrBefore(e.start)
	next, hasNext := f.after(e.start)
	if (hasPrev && prev.end() > e.start) || (hasNext && next.start < e.end()) {
		slog.Error("lsmt: freed space overlaps free space; dropping it", "start", e.start, "sectors", e.n)
		return
	}
	if hasPrev && prev.end() == e.start {
		f.remove(prev)
		e = extent{prev.start, prev.n + e.n}
	}
	if hasNext && next.start == e.end() {
		f.remove(next)
		e.n += next.n
	}
	f.insert(e)
}

func (f *freeExtents) atOrBefore(s uint64) (extent, bool) {
	var out extent
	ok := false
	f.byStart.DescendLessOrEqual(extent{start: s}, func(e extent) bool {
		out, ok = e, true
		return false
	})
	return out, ok
}

func (f *freeExtents) after(s uint64) (extent, bool) {
	var out extent
	ok := false
	f.byStart.AscendGreaterOrEqual(extent{start: s + 1}, func(e extent) bool {
		out, ok = e, true
		return false
	})
	return out, ok
}

// take removes n sectors (n <= total) and appends them to dst: one extent
// when one is large enough (the smallest such, so large extents stay whole
// for large writes), else the largest extents first (the fewest pieces).
func (f *freeExtents) take(dst []extent, n uint64) []extent {
	if n == 0 {
		return dst
	}
	var fit extent
	found := false
	f.bySize.AscendGreaterOrEqual(extent{n: n}, func(e extent) bool {
		fit, found = e, true
		return false
	})
	if found {
		return f.cut(dst, fit, n)
	}
	for n > 0 {
		e, ok := f.bySize.Max()
		if !ok {
			break
		}
		l := min(e.n, n)
		dst = f.cut(dst, e, l)
		n -= l
	}
	return dst
}

// cut takes the first n sectors of the free extent e.
func (f *freeExtents) cut(dst []extent, e extent, n uint64) []extent {
	f.remove(e)
	if e.n > n {
		f.insert(extent{e.start + n, e.n - n})
	}
	return appendExtent(dst, extent{e.start, n})
}

// appendExtent appends e, extending the last extent when e continues it.
func appendExtent(dst []extent, e extent) []extent {
	if k := len(dst) - 1; k >= 0 && dst[k].end() == e.start {
		dst[k].n += e.n
		return dst
	}
	return append(dst, e)
}

// growSlack is how far (sectors) past the virtual size the data file may
// grow before a write that needs space first makes freed space reusable (a
// flush): a 32nd of the disk, at least 256 KiB and at most 64 MiB, so a
// churning guest costs one extra flush per that much written.
func growSlack(vsec uint64) uint64 {
	return min(max(vsec/32, (256<<10)/SectorSize), (64<<20)/SectorSize)
}

// softLimit is the data file's logical end (sectors) past which a write
// that needs space first reclaims what trims freed (see reclaim).
func (u *Upper) softLimit() uint64 {
	return HeaderSize/SectorSize + u.hdr.VirtualSize/SectorSize + u.slack
}

// hardLimit is the data file's logical end past which writes fail with
// ENOSPC. Live data never exceeds the virtual size and every freed sector
// is reclaimed before the soft limit is passed, so only space held by
// concurrent writes of the same sectors can reach it.
func (u *Upper) hardLimit() uint64 {
	return HeaderSize/SectorSize + 2*u.hdr.VirtualSize/SectorSize + u.slack
}

// allocLocked appends n sectors of space to dst: free extents first, then
// the end of the data file, up to limit (errNoSpace past it, nothing
// taken). mu held.
func (u *Upper) allocLocked(dst []extent, n, limit uint64) ([]extent, error) {
	short := n - min(n, u.sp.free.total)
	if short > 0 && u.dataEnd+short > limit {
		return dst, errNoSpace
	}
	dst = u.sp.free.take(dst, n-short)
	if short > 0 {
		dst = appendExtent(dst, extent{u.dataEnd, short})
		u.dataEnd += short
	}
	return dst, nil
}

// unallocLocked returns space a failed write took. mu held.
func (u *Upper) unallocLocked(got []extent) {
	for _, e := range got {
		u.sp.free.add(e)
	}
}
