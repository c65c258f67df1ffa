package lsmt

import "fmt"

// flushIndex writes the pending mappings as one index batch, ordered on disk
// after the data they map: it takes the batch, fsyncs the data file (every
// mapping in the batch was added after its data write returned), then
// appends the batch to the index file and fsyncs that. Writers go on while
// it waits (mu is held only to take the batch). Unless always, it does
// nothing when the batch was taken by another flush meanwhile.
func (u *Upper) flushIndex(always bool) error {
	u.flushMu.Lock()
	defer u.flushMu.Unlock()
	u.mu.Lock()
	if !always && len(u.pending) < pendingLimit {
		u.mu.Unlock()
		return nil
	}
	batch := u.pending
	u.pending, u.spare = u.spare[:0], nil
	u.mu.Unlock()
	err := u.writeBatch(batch)
	u.mu.Lock()
	if err != nil {
		// Keep the mappings for the next attempt, in order, before newer ones.
		u.pending = append(batch, u.pending...)
	} else {
		u.spare = batch[:0]
	}
	u.mu.Unlock()
	return err
}

func (u *Upper) writeBatch(batch []byte) error {
	if err := u.data.Sync(); err != nil {
		return fmt.Errorf("sync upper data %s: %w", u.dataPath, err)
	}
	if len(batch) == 0 {
		return nil
	}
	if _, err := u.index.WriteAt(batch, u.indexEnd); err != nil {
		return fmt.Errorf("append upper index %s: %w", u.indexPath, err)
	}
	if err := u.index.Sync(); err != nil {
		return fmt.Errorf("sync upper index %s: %w", u.indexPath, err)
	}
	u.indexEnd += int64(len(batch))
	return nil
}

// Flush makes every completed write durable: data first, then the index.
func (u *Upper) Flush() error {
	if u.readOnly {
		return nil
	}
	if u.Sparse() {
		if err := u.data.Sync(); err != nil {
			return fmt.Errorf("sync upper data %s: %w", u.dataPath, err)
		}
		return nil
	}
	return u.flushIndex(true)
}
