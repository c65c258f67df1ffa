package lifecycle

import (
	"context"
	"fmt"
	"os"

	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/store"
)

// Removal says what a kill or a removal does beyond the sandbox's own VM,
// devices, directory and record: the serving node's volumes and registry.
type Removal struct {
	// Volumes (nil: none) hands the sandbox's volumes back (VM stopped,
	// devices still there).
	Volumes func(ctx context.Context, rec sandbox.Record)
	// Forget (nil: none) takes the sandbox out of whatever still names it
	// (the registry, the repository's uploads, the lazy disks, the memory
	// flattens).
	Forget func(rec sandbox.Record)
}

// Kill removes the sandbox and everything it owns, in stages:
//
//	freeze   a running guest flushes and freezes its read-write volumes
//	         (what it flushes is what they keep; serving sandboxes only)
//	record   "killing" (the commit point: recovery finishes a kill from
//	         here; a record already killing stays)
//	remove   the stages of Remove
//
// Recovery kills the sandboxes it cannot keep with the same verb.
func (v *Verbs) Kill(ctx context.Context, s Sandbox, how Removal) (err error) {
	done, _ := v.observe(s, "kill")
	defer func() { done(err) }()
	rec := s.Record()
	if !s.Adopted() && rec.State == sandbox.Running && sandbox.WritesVolumes(rec) {
		if err := sandbox.FreezeVolumes(ctx, s.Slot(), rec); err != nil {
			v.Log.Warn("the guest did not flush its volumes before the kill; what it had not written is lost as in a crash",
				"sandbox", rec.ID, "err", err)
		}
	}
	if rec.State != sandbox.Killing {
		if err := s.Transition(sandbox.Killing, nil); err != nil {
			return fmt.Errorf("kill sandbox %s: %w", rec.ID, err)
		}
	}
	if err := v.Remove(ctx, s, how); err != nil {
		return fmt.Errorf("kill sandbox %s: %w", rec.ID, err)
	}
	return nil
}

// Remove takes down whatever the sandbox holds, in stages, and forgets it:
//
//	stop_vmm  the VMM stops, the slot goes back
//	volumes   the volumes go back to their store (how.Volumes)
//	release   the devices are deleted
//	forget    nothing names the sandbox any more (how.Forget)
//	dir       its directory goes
//	record    last, its record goes
//
// A kill runs it after its "killing" record, a failed create after the
// create's own stages were undone.
func (v *Verbs) Remove(ctx context.Context, s Sandbox, how Removal) error {
	s.StopVM(ctx)
	if how.Volumes != nil {
		how.Volumes(ctx, s.Record())
	}
	s.ReleaseDevices(ctx)
	rec := s.Record()
	if how.Forget != nil {
		how.Forget(rec)
	}
	if err := os.RemoveAll(rec.Dir); err != nil {
		v.Log.Warn("remove sandbox dir", "sandbox", rec.ID, "err", err)
	}
	if err := v.Store.Delete(store.Sandboxes, rec.ID); err != nil {
		return fmt.Errorf("remove record of sandbox %s: %w", rec.ID, err)
	}
	return nil
}
