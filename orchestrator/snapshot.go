package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/agentenv/agentenv/disk"
	"github.com/agentenv/agentenv/lifecycle"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/template"

	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/store"
)

// Snapshots are persistent, named restore points of a sandbox, taken while
// it keeps running: the VM pauses, its state, memory and disk are captured,
// and it resumes in place. A snapshot's id or name is accepted wherever a
// template id is (create, fork children). What a snapshot is on disk, and
// its record, are package snapshot's.

// asTemplate is the snapshot r seen as a template to create sandboxes from.
func asTemplate(r snapshot.Record) *template.Template {
	return &template.Template{ID: r.ID, Dir: r.Dir, Snapshot: r.VM, Rootfs: r.Rootfs, RootfsImage: r.RootfsImage,
		VCPUs: r.VCPUs, MemoryMiB: r.MemoryMiB, MemoryTargetMiB: r.MemoryTargetMiB, DiskMiB: r.DiskMiB, EnvdVersion: r.EnvdVersion, CreatedAt: r.CreatedAt,
		GuestToken: r.GuestToken, DriveSlots: r.DriveSlots, Drives: r.Drives}
}

// source resolves a template id, or a snapshot id or name, to what a
// sandbox is restored from.
func (o *Orchestrator) source(id string) (*template.Template, error) {
	t, err := o.Template(id)
	if err == nil || !errors.Is(err, ErrNotFound) {
		return t, err
	}
	snap, serr := o.Snapshot(id)
	if serr != nil {
		return nil, fmt.Errorf("template or snapshot %q: %w", id, ErrNotFound)
	}
	return asTemplate(snap), nil
}

// Snapshot returns a snapshot by id or name.
func (o *Orchestrator) Snapshot(idOrName string) (snapshot.Record, error) {
	return snapshot.Get(o.store, idOrName)
}

// Snapshots lists the visible snapshots, newest first, optionally only those
// of one sandbox or carrying one name.
func (o *Orchestrator) Snapshots(sandboxID, name string) ([]snapshot.Record, error) {
	return snapshot.List(o.store, sandboxID, name)
}

// CreateSnapshot captures a running sandbox (it pauses for the capture and
// resumes in place) or a paused one, under an optional unique name.
func (o *Orchestrator) CreateSnapshot(ctx context.Context, sandboxID, name string) (snapshot.Record, error) {
	if name != "" {
		if !snapshot.ValidName.MatchString(name) {
			return snapshot.Record{}, fmt.Errorf("snapshot name %q: letters, digits, '.', '_' and '-', at most 128: %w", name, ErrInvalid)
		}
		if _, err := o.source(name); err == nil {
			return snapshot.Record{}, fmt.Errorf("snapshot name %q is taken by a template or snapshot: %w", name, ErrConflict)
		}
	}
	s, err := o.lockOp(sandboxID)
	if err != nil {
		return snapshot.Record{}, err
	}
	defer s.op.Unlock()
	r, err := o.snapshotLocked(ctx, s, false)
	if err != nil {
		return r, err
	}
	if name != "" {
		r.Names = []string{name}
	}
	if err := o.store.Put(store.Snapshots, r.ID, r); err != nil {
		_ = os.RemoveAll(r.Dir)
		return snapshot.Record{}, fmt.Errorf("snapshot sandbox %s: %w", sandboxID, err)
	}
	_ = fpSnapshotStored.Inject()
	o.log.Info("snapshot created", "sandbox", sandboxID, "snapshot", r.ID, "name", name)
	o.afterSnapshotStored(ctx, r) // the repository's commit (hooks.go)
	return r, nil
}

// snapshotLocked captures s (op lock held) into a new snapshot directory
// (lifecycle.Verbs.Snapshot); the caller stores the record. On error
// nothing is left behind and a running sandbox keeps running.
func (o *Orchestrator) snapshotLocked(ctx context.Context, s *instance, hidden bool) (snapshot.Record, error) {
	return o.verbs.Snapshot(ctx, o.live(s), hidden, o.captureMemory)
}

// DeleteSnapshot removes a snapshot by id or name. It refuses while a
// sandbox or another snapshot still reads its files.
func (o *Orchestrator) DeleteSnapshot(idOrName string) error {
	// refMu: no create resolves this snapshot between the check and the delete.
	o.refMu.Lock()
	defer o.refMu.Unlock()
	r, err := o.Snapshot(idOrName)
	if err != nil {
		return err
	}
	if user := o.snapshotUser(r); user != "" {
		return fmt.Errorf("snapshot %s is in use by %s: %w", r.ID, user, ErrConflict)
	}
	if err := o.store.Delete(store.Snapshots, r.ID); err != nil {
		return fmt.Errorf("delete snapshot %s: %w", r.ID, err)
	}
	o.disks.Forget(r.Dir)
	if err := os.RemoveAll(r.Dir); err != nil {
		return fmt.Errorf("delete snapshot %s: %w", r.ID, err)
	}
	o.afterSnapshotDeleted(r) // its record in the upload queue goes
	o.log.Info("snapshot deleted", "snapshot", r.ID)
	return nil
}

// snapshotUser names a sandbox or snapshot whose files point into r.Dir.
func (o *Orchestrator) snapshotUser(r snapshot.Record) string {
	prefix := filepath.Clean(r.Dir) + string(filepath.Separator)
	uses := func(paths ...string) bool {
		for _, p := range paths {
			if strings.HasPrefix(p, prefix) {
				return true
			}
		}
		return false
	}
	for _, rec := range o.List() {
		if rec.TemplateID == r.ID || uses(append(snapshot.Refs(rec.RootfsImage), rec.Snapshot, rec.Memory.File)...) ||
			uses(rec.Memory.Layers...) || disk.UsesImage(disk.PlainDrives(rec.Drives), r.ID) || uses(snapshot.DriveRefs(disk.PlainDrives(rec.Drives))...) {
			return "sandbox " + rec.ID
		}
	}
	all, _ := store.ListAll[snapshot.Record](o.store, store.Snapshots)
	for _, other := range all {
		if other.ID != r.ID && (uses(snapshot.Refs(other.RootfsImage)...) || uses(snapshot.DriveRefs(other.Drives)...)) {
			return "snapshot " + other.ID
		}
		if other.ID != r.ID {
			if m, err := snapshot.ReadMemoryManifest(other.VM); err == nil && uses(append(m.Layers, m.File)...) {
				return "snapshot " + other.ID
			}
		}
	}
	return ""
}

// ForkResult is one child of a fork: its record, or why it failed.
type ForkResult = lifecycle.ForkResult

// forkParallelism bounds how many children restore at once: restores are
// CPU-bound in the VMM, so more than a couple per core only adds latency.
const forkParallelism = 4

// Fork snapshots a running sandbox once (it pauses for the capture and
// resumes in place) and starts count children from that snapshot, each
// with its own network slot, disk upper, access tokens and timeout
// (lifecycle.Verbs.Fork); the orchestrator admits, locks and creates.
func (o *Orchestrator) Fork(ctx context.Context, id string, count int, timeout time.Duration) ([]ForkResult, error) {
	if count < 1 || count > 100 {
		return nil, fmt.Errorf("fork: count %d is not within 1..100: %w", count, ErrInvalid)
	}
	release, err := o.admit(ctx, "fork", 0, count)
	if err != nil {
		return nil, fmt.Errorf("fork sandbox %s: %w", id, err)
	}
	defer release()
	s, err := o.lockOp(id)
	if err != nil {
		return nil, err
	}
	if st := o.state(s); st != sandbox.Running {
		s.op.Unlock()
		return nil, fmt.Errorf("fork sandbox %s: it is %s: %w", id, st, ErrConflict)
	}
	snap, out, err := o.verbs.Fork(ctx, o.live(s), lifecycle.ForkPlan{
		Count: count, Parallel: forkParallelism, Memory: o.captureMemory, Unlock: s.op.Unlock,
		Child: func(ctx context.Context, snap snapshot.Record, src sandbox.Record) (sandbox.Record, error) {
			return o.Create(ctx, forkChildOptions(snap, src, timeout))
		},
	})
	if err != nil {
		return nil, err
	}
	o.log.Info("sandbox forked", "sandbox", id, "snapshot", snap.ID, "children", count)
	return out, nil
}

// forkChildOptions creates a child from the fork's snapshot with the
// parent's settings; with no timeout given it ends when the parent does.
func forkChildOptions(snap snapshot.Record, src sandbox.Record, timeout time.Duration) CreateOptions {
	if timeout <= 0 {
		timeout = time.Until(src.EndAt)
	}
	return CreateOptions{TemplateID: snap.ID, Timeout: timeout, AutoPause: src.AutoPause, AutoResume: src.AutoResume,
		Secure: src.Secure, Metadata: src.Metadata, EnvVars: src.EnvVars, Policy: src.Policy,
		PrivateTraffic: src.TrafficToken != "", AutoPauseFilesystemOnly: src.AutoPauseFilesystemOnly}
}

// collectForkSnapshot deletes the hidden snapshot a fork took once its
// last child is gone.
func (o *Orchestrator) collectForkSnapshot(id string) {
	var r snapshot.Record
	if err := o.store.Get(store.Snapshots, id, &r); err != nil || !r.Hidden || o.snapshotUser(r) != "" {
		return
	}
	if err := o.DeleteSnapshot(id); err != nil {
		o.log.Warn("collect fork snapshot", "snapshot", id, "err", err)
	}
}
