package lsmt

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// When freed space may be written again. A trim (or a mapping that
// overrides data, which only writes racing on the same sectors produce)
// stops the upper from referencing some data; its space goes through:
//
//	limbo:   the mapping that freed it is pending, not in the index file
//	         yet. After a crash the index would still map the old range
//	         there, so writing other data there now could make it read
//	         another range's data.
//	durable: the mapping is in the index file and fsynced (flushIndex).
//	waiting: a read, an in-place write or a trim's punch that looked the
//	         range up before it was freed may still be using it. Every
//	         such operation holds a pin on the epoch it started in (taken
//	         under mu, with the lookup); the space waits for the pins of
//	         one epoch to drain.
//	free:    may be handed to a new write (alloc.go).
//
// Epochs: the durable space becomes waiting with waitGen = epoch, and epoch
// moves on, so operations that start later pin the other slot. Epoch moves
// only once the previous waiting set is free, i.e. once the slot about to
// be reused has drained, so a slot only ever counts operations of one
// epoch, and an operation spans at most one flip. All fields are guarded
// by mu; the pin counters are atomic (unpinned without the lock).
type spaceState struct {
	free    freeExtents
	limbo   []extent
	durable []extent
	waiting []extent
	waitGen uint64
	epoch   uint64
}

// errNoSpace: the allocation would pass its limit (becomes ENOSPC).
var errNoSpace = errors.New("no space")

// pinLocked pins the current epoch (mu held, for reading at least): space
// freed from now on is not handed out before unpin.
func (u *Upper) pinLocked() uint64 {
	g := u.sp.epoch
	u.pins[g&1].Add(1)
	return g
}

func (u *Upper) unpin(g uint64) { u.pins[g&1].Add(-1) }

// advanceLocked moves durable space on as far as the pins allow (mu held
// for writing, so no operation pins meanwhile).
func (u *Upper) advanceLocked() {
	s := &u.sp
	for {
		if len(s.waiting) > 0 {
			if u.pins[s.waitGen&1].Load() != 0 {
				return
			}
			for _, e := range s.waiting {
				s.free.add(e)
			}
			s.waiting = s.waiting[:0]
		}
		if len(s.durable) == 0 {
			return
		}
		s.waiting, s.durable = s.durable, s.waiting
		s.waitGen = s.epoch
		s.epoch++
	}
}

// reclaimableLocked reports whether freed space is on its way to the free
// extents (mu held).
func (u *Upper) reclaimableLocked() bool {
	return len(u.sp.limbo)+len(u.sp.durable)+len(u.sp.waiting) > 0
}

// reclaim makes the space freed so far free: it flushes the index (the
// limbo becomes durable), then waits for the operations that may still use
// it (I/O in flight: short). The caller holds no pin and not mu.
func (u *Upper) reclaim() error {
	if err := u.flushIndex(true); err != nil {
		return err
	}
	wait := 20 * time.Microsecond
	for range 200 {
		u.mu.Lock()
		u.advanceLocked()
		done := len(u.sp.waiting) == 0 && len(u.sp.durable) == 0
		u.mu.Unlock()
		if done {
			return nil
		}
		time.Sleep(wait)
		wait = min(2*wait, 10*time.Millisecond)
	}
	return nil // still pinned (a stalled read): the caller decides with what is free
}

// punch deallocates the data file's blocks of freed space, so the host gets
// them back (a trim's space is reused later, its blocks need not wait).
// The caller holds a pin taken when the space was freed, so it is not
// written again meanwhile. A file system that cannot punch is noted once;
// the space is still reused.
func (u *Upper) punch(freed []extent) {
	if u.noPunch.Load() {
		return
	}
	for _, e := range freed {
		var err error
		cerr := u.raw.Control(func(fd uintptr) {
			err = unix.Fallocate(int(fd), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE,
				int64(e.start)*SectorSize, int64(e.n)*SectorSize)
		})
		if err == nil {
			err = cerr
		}
		if err == nil {
			continue
		}
		if errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENOSYS) {
			u.noPunch.Store(true)
		}
		slog.Warn("lsmt: cannot punch freed space out of the upper's data; it is reused but not given back",
			"data", u.dataPath, "err", err)
		return
	}
}

// initSpace finds the free space of a just-opened upper: whatever in
// [HeaderSize, dataEnd) no live mapping references (garbage of older
// versions, data of writes whose mappings were lost in a crash, trimmed
// ranges). A writable open punches it and makes the index durable first:
// the index just read may be pages a crashed process wrote but did not
// fsync, and reusing space it frees is safe only once it is on disk.
func (u *Upper) initSpace() error {
	u.sp = spaceState{free: newFreeExtents()}
	if u.readOnly {
		return nil // a read-only upper allocates nothing
	}
	var used []extent
	u.tree.Ascend(func(s Segment) bool {
		if !s.Zeroed {
			used = append(used, extent{s.MOffset, uint64(s.Length)})
		}
		return true
	})
	slices.SortFunc(used, func(a, b extent) int { return cmp.Compare(a.start, b.start) })
	var free []extent
	pos := uint64(HeaderSize / SectorSize)
	for _, e := range used {
		if e.start > pos {
			free = append(free, extent{pos, e.start - pos})
		}
		pos = max(pos, e.end())
	}
	if pos < u.dataEnd {
		free = append(free, extent{pos, u.dataEnd - pos})
	}
	if err := u.index.Sync(); err != nil {
		return fmt.Errorf("sync index %s: %w", u.indexPath, err)
	}
	if err := syncDirs(u.indexPath); err != nil {
		return fmt.Errorf("sync index %s: %w", u.indexPath, err)
	}
	u.punch(free)
	for _, e := range free {
		u.sp.free.add(e)
	}
	return nil
}
