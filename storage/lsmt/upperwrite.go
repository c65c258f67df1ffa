package lsmt

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/agentenv/agentenv/internal/failpoint"
)

// Fault points that slow (or fail) an operation between the lookup that
// pinned its space and its I/O, to test what runs meanwhile.
var (
	fpWritePlanned = failpoint.New("lsmt/write/planned")  // space allocated and pinned, nothing written
	fpTrimFreed    = failpoint.New("lsmt/trim/freed")     // mappings zeroed, the freed space not yet punched
	fpReadLookedUp = failpoint.New("lsmt/read/looked-up") // the upper's mappings looked up and pinned, nothing read
)

// WriteAt writes sector-aligned data at the logical byte offset off.
func (u *Upper) WriteAt(p []byte, off int64) (int, error) {
	if err := u.checkRange("write", off, int64(len(p))); err != nil {
		return 0, err
	}
	if len(p) == 0 {
		return 0, nil
	}
	sec := uint64(off) / SectorSize
	n := uint64(len(p)) / SectorSize
	if u.sparse {
		return u.writeSparse(p, off, sec, n)
	}
	if err := u.writeLog(p, sec, n); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (u *Upper) writeSparse(p []byte, off int64, sec, n uint64) (int, error) {
	if _, err := u.data.WriteAt(p, HeaderSize+off); err != nil {
		return 0, fmt.Errorf("write upper %s: %w", u.dataPath, err)
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	for done := uint64(0); done < n; {
		l := min(n-done, MaxSegmentLen)
		u.insertLocked(Segment{Offset: sec + done, MOffset: sec + done + HeaderSize/SectorSize, Length: uint32(l)}, nil)
		done += l
	}
	return len(p), nil
}

// writePlan says where the sectors of one write go: the pieces over data
// the upper holds are written in place (inPlace, clipped mappings), the
// others (holes, zeroed ranges) get the space got and become new mappings
// (fresh).
type writePlan struct {
	inPlace []Segment
	fresh   []Segment
	got     []extent
	uncov   []Segment // the pieces needing space (Offset, Length)
	gen     uint64    // the pinned epoch, when inPlace is not empty
}

// writeLog writes to a log-structured upper: plan under mu (pinning the
// in-place pieces' space, allocating the rest), write without it, then
// insert the new mappings.
func (u *Upper) writeLog(p []byte, sec, n uint64) error {
	// Backing arrays on the stack keep a small write from allocating.
	var inl, frl, unl [4]Segment
	var gtl [4]extent
	pl := writePlan{inPlace: inl[:0], fresh: frl[:0], uncov: unl[:0], got: gtl[:0]}
	for attempt := 0; ; attempt++ {
		var err error
		if pl, err = u.plan(pl, sec, n, attempt); err == nil {
			break
		}
		if !errors.Is(err, errNoSpace) || attempt > 0 {
			return err
		}
		if err := u.reclaim(); err != nil {
			return fmt.Errorf("write upper %s: %w", u.dataPath, err)
		}
	}
	err := fpWritePlanned.Inject()
	if err == nil {
		err = u.writePieces(p, sec, pl)
	}
	if len(pl.inPlace) > 0 {
		u.unpin(pl.gen)
	}
	if len(pl.fresh) == 0 {
		return err // in place only: nothing to map, nothing taken
	}
	u.mu.Lock()
	if err != nil {
		u.unallocLocked(pl.got)
		u.mu.Unlock()
		return err
	}
	var buf [4]extent
	freed := buf[:0]
	k := len(u.pending)
	for _, s := range pl.fresh {
		// Overrides data only when a write of the same sectors raced this
		// one: that space is freed like a trim's (not punched: it is reused).
		freed = u.addLocked(s, freed[:0])
	}
	journaled := u.journalLocked(u.pending[k:])
	full := len(u.pending) >= pendingLimit
	u.mu.Unlock()
	if full || !journaled {
		return u.flushIndex(!journaled)
	}
	return nil
}

// plan returns pl filled for the write of n sectors at sec (see
// writePlan). Past the soft limit it answers errNoSpace when freed space
// can be reclaimed (the caller reclaims and plans again), and the hard
// limit applies after. (Plans go by value: written through a pointer,
// their backing arrays would leave the stack.)
func (u *Upper) plan(pl writePlan, sec, n uint64, attempt int) (writePlan, error) {
	pl.fresh, pl.got = pl.fresh[:0], pl.got[:0]
	var need, ver uint64
	if attempt == 0 {
		// Most writes go in place: that needs mu only for reading, so
		// such writes do not wait for each other. The others keep this
		// split when the tree does not change before mu is theirs.
		u.mu.RLock()
		pl.inPlace, pl.uncov, need = u.splitLocked(pl.inPlace[:0], pl.uncov[:0], sec, n)
		if need == 0 && !u.closed {
			pl.gen = u.pinLocked()
			u.mu.RUnlock()
			return pl, nil
		}
		ver = u.treeVer
		u.mu.RUnlock()
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.closed {
		return pl, fmt.Errorf("write upper %s: closed", u.dataPath)
	}
	if attempt > 0 || u.treeVer != ver {
		pl.inPlace, pl.uncov, need = u.splitLocked(pl.inPlace[:0], pl.uncov[:0], sec, n)
	}
	if need > 0 {
		limit := u.softLimit()
		if attempt > 0 || !u.reclaimableLocked() {
			limit = u.hardLimit()
		}
		var err error
		if pl.got, err = u.allocLocked(pl.got, need, limit); err != nil {
			if limit == u.hardLimit() {
				return pl, fmt.Errorf("write upper %s: its data would pass %d bytes: %w",
					u.dataPath, limit*SectorSize, syscall.ENOSPC)
			}
			return pl, err
		}
		pl.fresh = mapFresh(pl.fresh, pl.uncov, pl.got)
	}
	if len(pl.inPlace) > 0 {
		pl.gen = u.pinLocked()
	}
	return pl, nil
}

// splitLocked cuts [sec, sec+n) into the pieces over live data (appended
// to inPlace, clipped mappings) and the rest (appended to uncov), and
// returns how many sectors the rest needs (mu held). One tree probe finds
// the mapping at sec; only when that does not hold the whole write does a
// second one find the others.
func (u *Upper) splitLocked(inPlace, uncov []Segment, sec, n uint64) ([]Segment, []Segment, uint64) {
	end := sec + n
	cur := sec
	u.tree.DescendLessOrEqual(Segment{Offset: sec}, func(it Segment) bool {
		if it.End() > sec {
			inPlace, cur = append(inPlace, it.Clip(sec, end)), min(it.End(), end)
		}
		return false
	})
	if cur < end {
		inPlace = u.lookupAfter(inPlace, sec, end)
	}
	if len(inPlace) == 1 && !inPlace[0].Zeroed && cur == end {
		return inPlace, uncov, 0 // the common overwrite: one mapping holds it all
	}
	cur, need := sec, uint64(0)
	k := 0
	for _, s := range inPlace {
		if s.Offset > cur {
			uncov = appendRange(uncov, cur, s.Offset)
		}
		if s.Zeroed {
			uncov = appendRange(uncov, s.Offset, s.End())
		} else {
			inPlace[k] = s
			k++
		}
		cur = s.End()
	}
	if cur < end {
		uncov = appendRange(uncov, cur, end)
	}
	for _, r := range uncov {
		need += uint64(r.Length)
	}
	return inPlace[:k], uncov, need
}

// appendRange appends the logical range [a, b) to rs, extending the last
// range when it continues it (lengths may pass MaxSegmentLen here).
func appendRange(rs []Segment, a, b uint64) []Segment {
	if k := len(rs) - 1; k >= 0 && rs[k].End() == a {
		rs[k].Length += uint32(b - a)
		return rs
	}
	return append(rs, Segment{Offset: a, Length: uint32(b - a)})
}

// mapFresh lays the logical ranges uncov over the space got, in order, as
// mappings of at most MaxSegmentLen sectors.
func mapFresh(dst, uncov []Segment, got []extent) []Segment {
	ei, eoff := 0, uint64(0)
	for _, r := range uncov {
		for done := uint64(0); done < uint64(r.Length); {
			e := got[ei]
			l := min(uint64(r.Length)-done, e.n-eoff, MaxSegmentLen)
			dst = append(dst, Segment{Offset: r.Offset + done, MOffset: e.start + eoff, Length: uint32(l)})
			done += l
			if eoff += l; eoff == e.n {
				ei, eoff = ei+1, 0
			}
		}
	}
	return dst
}

// writePieces writes the data of a plan: in place, then the new space,
// where mappings that continue each other in the file are one write.
func (u *Upper) writePieces(p []byte, sec uint64, pl writePlan) error {
	for _, s := range pl.inPlace {
		if err := u.writeData(p, sec, s.Offset, s.MOffset, uint64(s.Length)); err != nil {
			return err
		}
	}
	for i := 0; i < len(pl.fresh); {
		s := pl.fresh[i]
		l := uint64(s.Length)
		j := i + 1
		for ; j < len(pl.fresh) && pl.fresh[j].Offset == s.Offset+l && pl.fresh[j].MOffset == s.MOffset+l; j++ {
			l += uint64(pl.fresh[j].Length)
		}
		if err := u.writeData(p, sec, s.Offset, s.MOffset, l); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// writeData writes the l sectors of p (which starts at logical sector sec)
// from logical sector at to physical sector phys.
func (u *Upper) writeData(p []byte, sec, at, phys, l uint64) error {
	b := p[(at-sec)*SectorSize : (at-sec+l)*SectorSize]
	if _, err := u.data.WriteAt(b, int64(phys)*SectorSize); err != nil {
		return fmt.Errorf("write upper %s: %w", u.dataPath, err)
	}
	return nil
}

// addLocked inserts s and queues it for the index; the space of the data
// it overrides goes to limbo and is appended to freed.
func (u *Upper) addLocked(s Segment, freed []extent) []extent {
	k := len(freed)
	freed = u.insertLocked(s, freed)
	u.sp.limbo = append(u.sp.limbo, freed[k:]...)
	var b [MappingSize]byte
	EncodeMapping(b[:], s)
	u.pending = append(u.pending, b[:]...)
	return freed
}

// Trim makes the sector-aligned range read as zeros (hiding lower layers).
// The space of data the upper held there is punched out of the data file
// and reused by later writes once the trim is durable.
func (u *Upper) Trim(off, n int64) error {
	if err := u.checkRange("trim", off, n); err != nil {
		return err
	}
	if u.sparse {
		return u.trimSparse(off, n)
	}
	sec, cnt := uint64(off)/SectorSize, uint64(n)/SectorSize
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		return fmt.Errorf("trim upper %s: closed", u.dataPath)
	}
	if u.zeroedLocked(sec, cnt) {
		// Trimming again what reads as zeros already (fstrim after each
		// mount) adds nothing: no mapping, no index growth.
		u.mu.Unlock()
		return nil
	}
	var buf [8]extent
	freed := buf[:0]
	k := len(u.pending)
	for done := uint64(0); done < cnt; {
		l := min(cnt-done, MaxSegmentLen)
		freed = u.addLocked(Segment{Offset: sec + done, Length: uint32(l), Zeroed: true}, freed)
		done += l
	}
	journaled := u.journalLocked(u.pending[k:])
	var g uint64
	if len(freed) > 0 {
		g = u.pinLocked() // no write gets the space before it is punched
	}
	full := len(u.pending) >= pendingLimit
	u.mu.Unlock()
	if len(freed) > 0 {
		_ = fpTrimFreed.Inject() // delays only: the trim is done, the punch gives blocks back
		u.punch(freed)
		u.unpin(g)
	}
	if full || !journaled {
		return u.flushIndex(!journaled)
	}
	return nil
}

func (u *Upper) trimSparse(off, n int64) error {
	zero := make([]byte, min(n, 1<<20))
	for done := int64(0); done < n; {
		l := min(n-done, int64(len(zero)))
		if _, err := u.WriteAt(zero[:l], off+done); err != nil {
			return err
		}
		done += l
	}
	return nil
}

// zeroedLocked reports whether zeroed mappings cover [sec, sec+n) without
// a gap (mu held).
func (u *Upper) zeroedLocked(sec, n uint64) bool {
	cur, ok := sec, true
	u.tree.DescendLessOrEqual(Segment{Offset: sec}, func(it Segment) bool {
		if it.End() > sec {
			if !it.Zeroed {
				ok = false
			}
			cur = it.End()
		}
		return false
	})
	if !ok || cur == sec {
		return false
	}
	u.tree.AscendRange(Segment{Offset: sec + 1}, Segment{Offset: sec + n}, func(it Segment) bool {
		if it.Offset != cur || !it.Zeroed {
			ok = false
			return false
		}
		cur = it.End()
		return true
	})
	return ok && cur >= sec+n
}
