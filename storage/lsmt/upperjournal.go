package lsmt

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
)

// The pending journal. A write is answered once its data is written and its
// mappings are in the tree; they reach the index file only at the next
// flush. If the serving process dies in between (the storage daemon killed,
// a ublk server replaced), the kernel and the guest above it hold the write
// as done, the flush they send next is answered by the new process, and the
// mappings would be gone: the range would read its old data although a
// flush after the write succeeded.
//
// So every mapping queued for the index is also appended, unsynced, to
// INDEX.pending. The page cache keeps it when the process dies, not when
// the machine does (where losing writes no flush covered is allowed). The
// next open replays it over the index when it was written in the same boot
// over the same data file (its header says which), and makes the mappings
// durable at once; a journal of another boot is ignored.
//
// The journal holds the pending mappings, and after a flush whose rotation
// did not happen (a crash between the two, a failed rotation) also some the
// index holds. Replaying a run of range overrides again over a state that
// already ends with part of that run leaves the same state, so that is
// harmless. It is rotated under mu after each flush: writes append to it
// under mu too, so it never misses one.

const (
	journalMagic    = "LSMTPEND"
	journalHeadSize = 96 // magic, layer uuid, data file dev and inode, boot id; a multiple of MappingSize
)

// bootID identifies this boot of the machine ("" where unknown: no journal
// is written and writes flush instead). A variable for tests.
var bootID = sync.OnceValue(func() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
})

// JournalPath names the pending journal of the upper whose index file is
// indexPath: it belongs with the data and index files (removed with them).
func JournalPath(indexPath string) string { return indexPath + ".pending" }

// journalHeader is the header a journal of this upper in this boot has,
// nil when there is no boot id. open computes it once (u.journalHead).
func (u *Upper) journalHeader() ([]byte, error) {
	boot := bootID()
	if boot == "" {
		return nil, nil
	}
	st, err := u.data.Stat()
	if err != nil {
		return nil, err
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return nil, nil
	}
	h := make([]byte, journalHeadSize)
	copy(h, journalMagic)
	copy(h[8:], u.hdr.UUID[:])
	binary.LittleEndian.PutUint64(h[24:], uint64(sys.Dev))
	binary.LittleEndian.PutUint64(h[32:], sys.Ino)
	copy(h[40:], boot)
	return h, nil
}

// replayJournal inserts the mappings of a journal of this boot into the
// tree (after loadIndex), reading it in bounded chunks, and returns how
// many it inserted; it changes no file.
func (u *Upper) replayJournal() (int, error) {
	f, err := os.Open(JournalPath(u.indexPath))
	if os.IsNotExist(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("open pending journal: %w", err)
	}
	defer f.Close()
	got := make([]byte, journalHeadSize)
	if _, err := io.ReadFull(f, got); err != nil || u.journalHead == nil || !bytes.Equal(got, u.journalHead) {
		slog.Info("lsmt: ignoring a pending journal of another boot or data file", "index", u.indexPath)
		return 0, nil
	}
	n, err := u.replayEntries(bufio.NewReaderSize(f, 1<<20))
	if n > 0 {
		u.mapped.Store(true)
		slog.Info("lsmt: replayed the pending mappings of a process that ended without flushing",
			"index", u.indexPath, "mappings", n)
	}
	return n, err
}

// replayEntries inserts the journal's entries up to its end, a torn last
// entry (never answered) or an invalid one.
func (u *Upper) replayEntries(r io.Reader) (int, error) {
	vsec := u.hdr.VirtualSize / SectorSize
	var b [MappingSize]byte
	for n := 0; ; n++ {
		if _, err := io.ReadFull(r, b[:]); err == io.EOF || err == io.ErrUnexpectedEOF {
			return n, nil
		} else if err != nil {
			return n, fmt.Errorf("read pending journal: %w", err)
		}
		s := DecodeMapping(b[:])
		if reason := u.badEntry(s, vsec); s.IsPadding() || reason != "" {
			slog.Warn("lsmt: pending journal ends in an invalid entry; dropping the tail",
				"index", u.indexPath, "entry", n, "reason", reason)
			return n, nil
		}
		u.insertLocked(s, nil)
	}
}

// recoverJournal (open, writable) makes replayed mappings durable, after
// the data they map, by rewriting the index from the tree (bounded by the
// live mappings, whatever the journal's length), and starts an empty
// journal.
func (u *Upper) recoverJournal(replayed int) error {
	if replayed > 0 {
		if err := u.data.Sync(); err != nil {
			return fmt.Errorf("sync data: %w", err)
		}
		if err := u.rewriteIndex(u.tree); err != nil {
			return err
		}
	}
	removeStale(filepath.Dir(u.indexPath), "."+filepath.Base(JournalPath(u.indexPath))+".tmp-")
	u.rotateJournalLocked()
	return nil
}

// rotateJournalLocked replaces the journal with one holding exactly the
// pending mappings (mu held, or the upper not shared yet). The old journal
// stays in use when that fails: it holds them too.
func (u *Upper) rotateJournalLocked() {
	if u.journal != nil && len(u.pending) == 0 {
		if u.journalEnd == journalHeadSize {
			return
		}
		if err := u.journal.Truncate(journalHeadSize); err == nil {
			u.journalEnd = journalHeadSize
			return
		}
	}
	f, err := u.writeJournal()
	if err != nil {
		slog.Warn("lsmt: cannot rotate the pending journal", "index", u.indexPath, "err", err)
		return
	}
	if u.journal != nil {
		u.journal.Close()
	}
	u.journal, u.journalEnd = f, journalHeadSize+int64(len(u.pending))
}

// writeJournal writes a new journal of the pending mappings next to the old
// one and renames it over it; nil without a boot id. Nothing is fsynced
// (not atomicfile): the journal only has to outlive the process, and the
// page cache orders the write before the rename for every later reader.
func (u *Upper) writeJournal() (*os.File, error) {
	if u.journalHead == nil {
		return nil, nil
	}
	path := JournalPath(u.indexPath)
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return nil, err
	}
	_, err = f.Write(append(slices.Clip(u.journalHead), u.pending...))
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, err
	}
	return f, nil
}

// journalLocked appends the mappings just queued (mu held); false when they
// are not in a journal, and the write must flush before it is answered.
func (u *Upper) journalLocked(b []byte) bool {
	if u.journal == nil {
		return false
	}
	if _, err := u.journal.WriteAt(b, u.journalEnd); err != nil {
		slog.Warn("lsmt: cannot append to the pending journal; flushing instead", "index", u.indexPath, "err", err)
		return false
	}
	u.journalEnd += int64(len(b))
	return true
}

// closeJournal removes the journal of an upper closed after a flush.
func (u *Upper) closeJournal(flushed bool) {
	if u.journal == nil {
		return
	}
	u.journal.Close()
	u.journal = nil
	if flushed {
		os.Remove(JournalPath(u.indexPath))
	}
}

// removeStale removes the files of dir whose names start with prefix: the
// temporaries a crash left of a rename.
func removeStale(dir, prefix string) {
	stale, _ := filepath.Glob(filepath.Join(dir, globEscape(prefix)+"*"))
	for _, p := range stale {
		os.Remove(p)
	}
}
