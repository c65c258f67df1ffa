package lifecycle

import (
	"context"
	"errors"
	"time"

	"github.com/agentenv/agentenv/sandbox"
)

// BringUp starts a paused sandbox's VM from the snapshot directory from
// ("": it cold-boots its disk), recording its generation and VMM in the
// record (the orchestrator's sandbox.Start, on a warm pool's VM when one
// fits); on failure nothing of the VM is left. lap times its stages.
type BringUp func(ctx context.Context, from string, lap func(string)) error

// Resume runs a paused sandbox again, in stages:
//
//	record    "resuming", and whether it cold-boots (memory false, or a
//	          filesystem-only pause; undo: "paused" again)
//	vm        the VM comes up from the paused snapshot or boots the disk
//	          (up; undo: "paused" naming no VMM)
//	volumes   the guest mounts its volumes (a failure is logged)
//	record    "running" until now+timeout
//
// A failure leaves the sandbox paused as it was, on the same snapshot if
// it has one. beforeVM (nil: none) runs once "resuming" is durable (the
// flatten of the pause stops: the restore writes the layers).
func (v *Verbs) Resume(ctx context.Context, s Sandbox, memory bool, timeout time.Duration, beforeVM func(), up BringUp) (err error) {
	done, lap := v.observe(s, "resume")
	defer func() { done(err) }()
	var undo undoStack
	fail := func(cause error) error {
		return errors.Join(append([]error{cause}, undo.run(context.WithoutCancel(ctx))...)...)
	}
	if err := s.Transition(sandbox.Resuming, func(r *sandbox.Record) { r.ColdBoot = !memory || r.FilesystemOnly }); err != nil {
		if s.Record().State != sandbox.Resuming {
			return err // nothing recorded
		}
		undo.add(func(context.Context) error { return s.Transition(sandbox.Paused, nil) })
		return fail(err)
	}
	rec := s.Record()
	from := rec.Snapshot
	if rec.ColdBoot {
		from = ""
	}
	if beforeVM != nil {
		beforeVM()
	}
	if err := up(ctx, from, lap); err != nil {
		undo.add(func(context.Context) error {
			return s.Transition(sandbox.Paused, func(r *sandbox.Record) { r.PID, r.PIDStart, r.PoolClaim = 0, 0, false })
		})
		return fail(err)
	}
	rec = s.Record()
	if err := sandbox.MountVolumes(ctx, s.Slot(), rec); err != nil {
		v.Log.Warn("resume: the guest did not mount its volumes", "sandbox", rec.ID, "err", err)
	}
	return s.Transition(sandbox.Running, func(r *sandbox.Record) {
		r.EndAt, r.FilesystemOnly, r.Failure = time.Now().UTC().Add(timeout), false, ""
	})
}
