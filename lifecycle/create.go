package lifecycle

import (
	"context"
	"os"
	"slices"
	"time"

	"github.com/agentenv/agentenv/disk"
	"github.com/agentenv/agentenv/sandbox"
)

// Newborn is a sandbox a create brings up: registered by the node (its
// operation lock held) with nothing of it written yet.
type Newborn interface {
	Sandbox
	// RecordNew writes its first record, in state starting (the journal's
	// change from no record).
	RecordNew() error
}

// Creation is what a create brings beyond the registered sandbox.
type Creation struct {
	// From is the snapshot directory the VM restores: the template's, or
	// the snapshot's a create (a fork's child) starts from.
	From string
	// RootfsImage is the image config of the source's root disk.
	RootfsImage string
	// Timeout sets the end time once the sandbox runs.
	Timeout time.Duration
	// Up brings the VM up from From (the orchestrator's sandbox.Start, on
	// a warm pool's VM when one fits); on failure nothing of the VM is
	// left.
	Up BringUp
	// Removal is what undoing the create does beyond the sandbox's own
	// VM, devices, directory and record (Remove).
	Removal Removal
}

// Create brings a registered sandbox up, in stages:
//
//	dir      its directory (undo: Remove, which takes back what every
//	         later stage left, its record last, as recovery expects)
//	record   "starting": recovery rolls back a create from here
//	drives   the record names the source's root disk, and the extra
//	         drives that bring no image get blank layers (disk.PrepareDrives)
//	vm       the VM comes up from From (c.Up)
//	volumes  the guest mounts the sandbox's volumes
//	record   "running" until now+timeout
//
// A failure runs the undo stack: nothing of the sandbox is left, and
// what the undo could not remove is logged (recovery collects it). The
// node times the whole create, its admission included; Create times the
// VM's stages.
func (v *Verbs) Create(ctx context.Context, s Newborn, c Creation) error {
	var undo undoStack
	fail := func(cause error) error {
		for _, err := range undo.run(ctx) {
			v.Log.Warn("clean up a failed create", "sandbox", s.Record().ID, "err", err)
		}
		return cause
	}
	undo.add(func(ctx context.Context) error { return v.Remove(ctx, s, c.Removal) })
	if err := os.MkdirAll(s.Record().Dir, 0o700); err != nil {
		return fail(err)
	}
	if err := s.RecordNew(); err != nil {
		return fail(err)
	}
	if err := v.prepareDisks(ctx, s, c.RootfsImage); err != nil {
		return fail(err)
	}
	if err := c.Up(ctx, c.From, v.stage(s, "create")); err != nil {
		return fail(err)
	}
	if err := sandbox.MountVolumes(ctx, s.Slot(), s.Record()); err != nil {
		return fail(err)
	}
	now := time.Now().UTC()
	if err := s.Transition(sandbox.Running, func(r *sandbox.Record) { r.StartedAt, r.EndAt = now, now.Add(c.Timeout) }); err != nil {
		return fail(err)
	}
	return nil
}

// prepareDisks is the drives stage: the sandbox's record (in memory: the
// next write persists it) names the source's root disk and the blank
// layers of its new drives.
func (v *Verbs) prepareDisks(ctx context.Context, s Sandbox, rootfs string) error {
	rec := s.Record()
	drives := slices.Clone(rec.Drives)
	rec.RootfsImage, rec.Drives = rootfs, drives
	err := disk.PrepareDrives(ctx, &rec)
	s.Set(func(r *sandbox.Record) { r.RootfsImage, r.Drives = rootfs, drives })
	return err
}

// stage returns the function that times the stages of op's VM bring-up
// (Ops.Stage); a no-op without Ops or on an adopted VM.
func (v *Verbs) stage(s Sandbox, op string) func(string) {
	if v.Ops == nil || s.Adopted() {
		return func(string) {}
	}
	return v.Ops.Stage(op)
}
