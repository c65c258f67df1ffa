package lsmt

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/google/btree"
)

// Fault points of the index rewrite.
var (
	fpRewriteSynced  = failpoint.New("lsmt/index-rewrite/synced")  // the new index is fsynced, not renamed over the old one
	fpRewriteRenamed = failpoint.New("lsmt/index-rewrite/renamed") // the new index is renamed over the old one, its directory not fsynced
	fpFlushIndexed   = failpoint.New("lsmt/flush/indexed")         // the batch is durable in the index, the pending journal not rotated
)

// flushIndex writes the pending mappings as one index batch, ordered on disk
// after the data they map: it takes the batch, fsyncs the data file (every
// mapping in the batch was added after its data write returned), then
// appends the batch to the index file and fsyncs that. Writers go on while
// it waits (mu is held only to take the batch). Unless always, it does
// nothing when the batch was taken by another flush meanwhile.
//
// When the index file holds many more entries than there are live mappings
// (trims and rewrites of one range append one each), the batch is not
// appended: the index is rewritten from the tree as it was when the batch
// was taken, which is exactly the durable index plus the batch.
//
// Once the batch is durable, the space it freed moves on towards reuse.
func (u *Upper) flushIndex(always bool) error {
	u.flushMu.Lock()
	defer u.flushMu.Unlock()
	u.mu.Lock()
	if !always && len(u.pending) < pendingLimit {
		u.mu.Unlock()
		return nil
	}
	batch, freed := u.pending, u.sp.limbo
	u.pending, u.spare, u.sp.limbo = u.spare[:0], nil, nil
	var snap *btree.BTreeG[Segment]
	if u.rewriteDueLocked(len(batch)) {
		snap = u.tree.Clone() // copy on write: the tree goes on changing
	}
	u.mu.Unlock()
	err := u.writeBatch(batch, snap)
	if err == nil {
		err = fpFlushIndexed.Inject()
	}
	u.mu.Lock()
	if err != nil {
		// Keep the mappings for the next attempt, in order, before newer
		// ones (appending a batch again that a rewrite already holds
		// changes nothing), and the space they free with them.
		u.pending = append(batch, u.pending...)
		u.sp.limbo = append(freed, u.sp.limbo...)
	} else {
		u.spare = batch[:0]
		u.sp.durable = append(u.sp.durable, freed...)
		u.advanceLocked()
		u.rotateJournalLocked()
	}
	u.mu.Unlock()
	return err
}

// rewriteDueLocked: the index would hold more than four entries per live
// mapping and more than rewriteMin (flushMu and mu held).
func (u *Upper) rewriteDueLocked(batchBytes int) bool {
	entries := (u.indexEnd-HeaderSize)/MappingSize + int64(batchBytes/MappingSize)
	return entries > u.rewriteMin && entries > 4*int64(u.tree.Len())
}

func (u *Upper) writeBatch(batch []byte, snap *btree.BTreeG[Segment]) error {
	if err := u.data.Sync(); err != nil {
		return fmt.Errorf("sync upper data %s: %w", u.dataPath, err)
	}
	if snap != nil {
		return u.rewriteIndex(snap)
	}
	if len(batch) > 0 {
		if _, err := u.index.WriteAt(batch, u.indexEnd); err != nil {
			return fmt.Errorf("append upper index %s: %w", u.indexPath, err)
		}
		if err := u.index.Sync(); err != nil {
			return fmt.Errorf("sync upper index %s: %w", u.indexPath, err)
		}
		u.indexEnd += int64(len(batch))
	}
	// A rewrite whose directory sync failed: until it is done, a power
	// loss may bring the old index back, so nothing it freed is durable.
	if u.dirDirty {
		if err := syncDirs(u.indexPath); err != nil {
			return fmt.Errorf("sync upper index %s: %w", u.indexPath, err)
		}
		u.dirDirty = false
	}
	return nil
}

// rewriteIndex replaces the index file with the mappings of snap (whose
// data is fsynced): a new file next to it, fsynced, renamed over it, and
// the directory fsynced. A crash at any point leaves the old index or the
// new one, and both describe data that is on disk (flushMu held).
func (u *Upper) rewriteIndex(snap *btree.BTreeG[Segment]) error {
	f, err := os.CreateTemp(filepath.Dir(u.indexPath), "."+filepath.Base(u.indexPath)+".tmp-*")
	if err != nil {
		return fmt.Errorf("rewrite upper index %s: %w", u.indexPath, err)
	}
	size, err := u.writeIndexFile(f, snap)
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = fpRewriteSynced.Inject()
	}
	if err == nil {
		err = os.Rename(f.Name(), u.indexPath)
	}
	if err != nil {
		f.Close()
		os.Remove(f.Name())
		return fmt.Errorf("rewrite upper index %s: %w", u.indexPath, err)
	}
	old := u.index
	u.index, u.indexEnd, u.dirDirty = f, size, true
	old.Close()
	if err := fpRewriteRenamed.Inject(); err != nil {
		return fmt.Errorf("rewrite upper index %s: %w", u.indexPath, err)
	}
	if err := atomicfile.SyncDir(filepath.Dir(u.indexPath)); err != nil {
		return fmt.Errorf("rewrite upper index %s: %w", u.indexPath, err)
	}
	u.dirDirty = false
	return nil
}

// writeIndexFile writes the index header block the upper opened with and
// one mapping per segment of snap; it returns the file's size.
func (u *Upper) writeIndexFile(f *os.File, snap *btree.BTreeG[Segment]) (int64, error) {
	w := bufio.NewWriterSize(f, 256<<10)
	w.Write(u.indexHead)
	var b [MappingSize]byte
	snap.Ascend(func(s Segment) bool {
		EncodeMapping(b[:], s)
		_, err := w.Write(b[:])
		return err == nil
	})
	if err := w.Flush(); err != nil {
		return 0, err
	}
	return int64(len(u.indexHead)) + int64(snap.Len())*MappingSize, nil
}

// removeStaleRewrites removes what a crash during an index rewrite left.
func removeStaleRewrites(indexPath string) {
	removeStale(filepath.Dir(indexPath), "."+filepath.Base(indexPath)+".tmp-")
}

// globEscape quotes the pattern characters of a file name.
func globEscape(s string) string {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if c := s[i]; c == '*' || c == '?' || c == '[' || c == '\\' {
			out = append(out, '\\')
		}
		out = append(out, s[i])
	}
	return string(out)
}

// Flush makes every completed write durable: data first, then the index.
func (u *Upper) Flush() error {
	if u.readOnly {
		return nil
	}
	if u.sparse {
		if err := u.data.Sync(); err != nil {
			return fmt.Errorf("sync upper data %s: %w", u.dataPath, err)
		}
		return nil
	}
	return u.flushIndex(true)
}
