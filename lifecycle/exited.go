package lifecycle

import (
	"context"
	"fmt"

	"github.com/agentenv/agentenv/sandbox"
)

// PauseExited keeps what is left of a sandbox whose VMM ended without being
// asked to (it crashed or was killed, or a page of guest memory could not
// be read and the mapping faulted), or was found gone by the node's start:
// the guest's memory is lost, its disks are not. It is a filesystem-only
// pause without the guest's flush (what the guest had not written is lost
// as in a crash), in stages:
//
//	record    "pausing", filesystem-only, with why (Record.Failure); a
//	          pause the VMM's end interrupted is finished as this one
//	stop_vmm  the VMM's handle goes, the slot goes back
//	seal      the disks' uppers are sealed layers (remote layers first
//	          made local files: the seal lists them)
//	record    "paused", naming no memory: the commit point
//	release   the devices are deleted and the record says so
//
// A crash at any stage is finished by recovery, which finds the VMM gone
// and comes here again. A resume cold-boots the sandbox from its disk.
func (v *Verbs) PauseExited(ctx context.Context, s Sandbox, why string) (err error) {
	done, lap := v.observe(s, "pause_exited")
	defer func() { done(err) }()
	rec := s.Record()
	v.Log.Error("the sandbox's VMM ended unexpectedly: its memory is lost, its disks are kept (a filesystem-only pause)",
		"sandbox", rec.ID, "state", rec.State, "reason", why)
	if rec.State == sandbox.Pausing {
		s.Set(func(r *sandbox.Record) { r.FilesystemOnly, r.Failure = true, why })
	} else if err := s.Transition(sandbox.Pausing, func(r *sandbox.Record) { r.FilesystemOnly, r.Failure = true, why }); err != nil {
		return fmt.Errorf("record the end of the VMM of sandbox %s: %w", rec.ID, err)
	}
	lap("record")
	s.StopVM(ctx)
	lap("stop_vmm")
	if err := v.settle(ctx, s.Record()); err != nil {
		return fmt.Errorf("keep the disks of sandbox %s: %w", rec.ID, err)
	}
	if err := v.sealDisks(ctx, s); err != nil {
		return fmt.Errorf("keep the disks of sandbox %s: %w", rec.ID, err)
	}
	lap("seal")
	old, err := recordPaused(s, "", true)
	if err != nil {
		return fmt.Errorf("record sandbox %s paused: %w", rec.ID, err)
	}
	lap("record")
	return v.afterPaused(ctx, s, old, "", lap)
}
