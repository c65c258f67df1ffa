package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/vmm/qemu/migstream"
	"golang.org/x/sys/unix"
)

var _ vmm.DeviceSnapshotter = (*machine)(nil)

// SnapshotDevices implements vmm.DeviceSnapshotter.
//
// x-ignore-shared leaves only share=on RAM out of a migration, and a
// restored machine maps its memory image privately, so QEMU streams its
// whole RAM. Here QEMU migrates into a pipe and migstream drops the page
// records of the guest RAM block on their way to the state file. Loading
// that state with the same capability finds no pages for the block and
// leaves the (privately mapped) memory file's contents in place.
func (m *machine) SnapshotDevices(ctx context.Context, dir string) (*vmm.Snapshot, error) {
	start := time.Now()
	if err := m.requirePausedOnce(ctx); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("snapshot devices %s: %w", m.id, err)
	}
	snap := &vmm.Snapshot{Dir: dir, StateFile: filepath.Join(dir, vmm.SnapshotStateFile)}
	// Written aside and renamed, so a failure (after which the caller may
	// fall back to a full snapshot) never leaves a partial state behind.
	tmp := snap.StateFile + ".tmp"
	stats, err := m.saveFilteredState(ctx, tmp)
	if err == nil {
		err = os.Rename(tmp, snap.StateFile)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return nil, fmt.Errorf("snapshot devices %s: %w", m.id, err)
	}
	// A memory file already in dir (say, the image this VM was restored
	// from) stays: it may be in use. config.json's noMemory keeps Restore
	// from taking it for this snapshot's memory.
	spec := *m.spec
	spec.NoMemory = true
	b, _ := json.MarshalIndent(&spec, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, vmm.SnapshotConfigFile), b, 0o600); err != nil {
		return nil, fmt.Errorf("snapshot devices %s: %w", m.id, err)
	}
	snap.StateBytes = stats.BytesOut
	snap.MemBytes = int64(m.spec.MemoryMiB) << 20
	snap.Took = time.Since(start)
	m.log.Info("device snapshot written", "dir", dir, "state_bytes", snap.StateBytes,
		"stream_bytes", stats.BytesIn, "dropped_pages", stats.DroppedPages+stats.DroppedZeroPages,
		"took", snap.Took.Round(time.Millisecond))
	return snap, nil
}

// requirePausedOnce fails unless the VM is paused and took no snapshot
// during this pause. Unlike a full snapshot it must not run the guest to
// leave the postmigrate state: the caller may have captured guest memory
// already, and the state must match it.
func (m *machine) requirePausedOnce(ctx context.Context) error {
	if err := m.alive(); err != nil {
		return err
	}
	st, err := m.status(ctx)
	if err != nil {
		return fmt.Errorf("snapshot devices %s: %w", m.id, err)
	}
	switch st {
	case "paused":
		return nil
	case "postmigrate":
		return fmt.Errorf("snapshot devices %s: the vm already took (or failed) a snapshot during this pause; resume and pause it, or take a full Snapshot: %w", m.id, vmm.ErrUnsupported)
	default:
		return fmt.Errorf("snapshot devices %s: vm is %s: %w", m.id, st, vmm.ErrNotPaused)
	}
}

// requirePaused fails unless the VM is paused (or stopped after a
// migration), and makes a VM stopped after a migration migratable again.
func (m *machine) requirePaused(ctx context.Context, op string) error {
	if err := m.alive(); err != nil {
		return err
	}
	st, err := m.status(ctx)
	if err != nil {
		return fmt.Errorf("%s %s: %w", op, m.id, err)
	}
	switch st {
	case "paused":
		return nil
	case "postmigrate":
		if err := m.leavePostmigrate(ctx); err != nil {
			return fmt.Errorf("%s %s: %w", op, m.id, err)
		}
		return nil
	default:
		return fmt.Errorf("%s %s: vm is %s: %w", op, m.id, st, vmm.ErrNotPaused)
	}
}

// leavePostmigrate readies a VM that already took a snapshot (or had one
// fail) during this pause for another. QEMU refuses to migrate from the
// postmigrate run state, in which a completed migration also left the disks
// inactive, and the only way out without a reset is to run: so the vCPUs
// run for an instant (cont reactivates the disks) and stop again. The guest
// moves on by those milliseconds, as if paused a moment later.
func (m *machine) leavePostmigrate(ctx context.Context) error {
	if err := m.qmp.Execute(ctx, "cont", nil, nil); err != nil {
		return fmt.Errorf("leave postmigrate: %w", err)
	}
	if err := m.qmp.Execute(ctx, "stop", nil, nil); err != nil {
		return fmt.Errorf("leave postmigrate: %w", err)
	}
	m.log.Info("vm ran for an instant to leave the postmigrate state before another snapshot")
	return nil
}

// saveFilteredState migrates into a pipe and writes the stream, without
// the guest RAM block's pages, to path.
func (m *machine) saveFilteredState(ctx context.Context, path string) (*migstream.Stats, error) {
	out, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("state file: %w", err)
	}
	defer out.Close()
	pr, pw, err := blockingPipe()
	if err != nil {
		return nil, fmt.Errorf("state pipe: %w", err)
	}
	defer pr.Close()
	// A large pipe lets QEMU's migration thread and the filter run with few
	// wakeups (the default 64 KiB is two of QEMU's buffer flushes); the
	// kernel caps it at fs.pipe-max-size, and a smaller pipe only costs time.
	_, _ = unix.FcntlInt(pw.Fd(), unix.F_SETPIPE_SZ, statePipeSize)
	err = m.qmp.ExecuteWithFile(ctx, "getfd", map[string]any{"fdname": "aenv-devstate"}, pw, nil)
	pw.Close() // QEMU holds its own copy; EOF comes when it closes that
	if err != nil {
		return nil, fmt.Errorf("pass state pipe: %w", err)
	}

	done := make(chan filterResult, 1)
	filterFailed := make(chan struct{})
	go func() {
		stats, err := migstream.Filter(out, pr, migstream.Options{DropBlocks: []string{guestRAMBlock}, MaxOutput: maxDeviceState})
		if err != nil {
			close(filterFailed)
			// Keep reading so QEMU never blocks on a full pipe while the
			// migration is cancelled; it ends when QEMU closes its end.
			_, _ = io.Copy(io.Discard, pr)
		}
		done <- filterResult{stats, err}
	}()

	migErr := m.qmp.Execute(ctx, "migrate", map[string]any{"uri": "fd:aenv-devstate"}, nil)
	if migErr != nil {
		// QEMU may still hold the descriptor; drop it so the reader ends.
		_ = m.qmp.Execute(context.WithoutCancel(ctx), "closefd", map[string]any{"fdname": "aenv-devstate"}, nil)
		migErr = fmt.Errorf("save state: %w", migErr)
	} else {
		migErr = m.waitMigrationOr(ctx, filterFailed)
	}
	res, err := m.awaitFilter(ctx, done, pr)
	if err != nil {
		return nil, err
	}
	// The cause first: content the filter refused, else a failed migration
	// (which also cuts the stream short), else a stream the filter found broken.
	switch {
	case errors.Is(res.err, migstream.ErrUnsupported):
		return nil, fmt.Errorf("filter migration stream (%w): %w", vmm.ErrUnsupported, res.err)
	case res.err != nil && errors.Is(migErr, errFilterAborted):
		return nil, fmt.Errorf("filter migration stream: %w", res.err)
	case migErr != nil:
		return nil, migErr
	case res.err != nil:
		return nil, fmt.Errorf("filter migration stream: %w", res.err)
	}
	if err := out.Sync(); err != nil {
		return nil, fmt.Errorf("state file: %w", err)
	}
	return res.stats, nil
}

// awaitFilter waits for the filter goroutine. QEMU closes its end of the
// pipe when the migration is cleaned up, a moment after it reports
// completion; should it not, closing our end unblocks the reader.
func (m *machine) awaitFilter(ctx context.Context, done <-chan filterResult, pr *os.File) (filterResult, error) {
	select {
	case res := <-done:
		return res, nil
	case <-ctx.Done():
	case <-time.After(30 * time.Second):
	}
	pr.Close()
	res := <-done
	if ctx.Err() != nil {
		return res, ctx.Err()
	}
	return res, errors.New("qemu did not close the migration stream")
}

// waitMigrationOr is waitMigration that also cancels the migration when
// abort is closed, reporting a migration that did not complete.
func (m *machine) waitMigrationOr(ctx context.Context, abort <-chan struct{}) error {
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-abort:
			cancel()
		case <-actx.Done():
		}
	}()
	err := m.waitMigration(actx)
	if err != nil && actx.Err() != nil {
		// waitMigration asked QEMU to cancel; the next migration may start
		// only once this one has left the cancelling state.
		m.settleMigration(context.WithoutCancel(ctx))
		if ctx.Err() == nil {
			return errFilterAborted
		}
	}
	return err
}

// settleMigration waits (a bounded time) until no migration is under way.
func (m *machine) settleMigration(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		var info struct {
			Status string `json:"status"`
		}
		if err := m.qmp.Execute(ctx, "query-migrate", nil, &info); err != nil {
			return
		}
		switch info.Status {
		case "", "none", "completed", "failed", "cancelled":
			return
		}
		select {
		case <-ctx.Done():
			m.log.Warn("migration still under way after cancel", "status", info.Status)
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}

const statePipeSize = 1 << 20

// maxDeviceState bounds a state written without RAM. Our machines' device
// state is about 64 KiB (plus firmware and ACPI blobs); far more means
// something other than device state is in the stream.
const maxDeviceState = 64 << 20

// blockingPipe is os.Pipe with a blocking write end. os.Pipe makes both
// ends non-blocking (for Go's poller), and QEMU would inherit that on its
// end: its migration thread then meets EAGAIN on every full pipe and waits
// in a poll loop, which made the stream several times slower than into a
// file. The read end stays non-blocking, so closing it unblocks our reader.
func blockingPipe() (r, w *os.File, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, nil, err
	}
	if err := unix.SetNonblock(p[0], true); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return nil, nil, err
	}
	return os.NewFile(uintptr(p[0]), "state-pipe-r"), os.NewFile(uintptr(p[1]), "state-pipe-w"), nil
}

var errFilterAborted = errors.New("migration cancelled: the stream filter failed")

type filterResult struct {
	stats *migstream.Stats
	err   error
}
