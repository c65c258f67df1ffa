package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/sandbox"
)

// Kill stops the sandbox and removes everything it owns.
func (o *Orchestrator) Kill(ctx context.Context, id string) (err error) {
	s, err := o.lockOp(id)
	if err != nil {
		return err
	}
	defer s.op.Unlock()
	return o.killLocked(ctx, s)
}

// killLocked (op held) kills s (lifecycle.Verbs.Kill): "killing", then
// its VM, slot, volumes, devices, directory and last its record go;
// recovery finishes a kill a crash interrupted.
func (o *Orchestrator) killLocked(ctx context.Context, s *instance) error {
	tmpl := o.live(s).Record().TemplateID
	if err := o.verbs.Kill(ctx, o.live(s), o.removal(s)); err != nil {
		return err
	}
	o.log.Info("sandbox killed", "sandbox", o.live(s).Record().ID)
	o.collectForkSnapshot(tmpl)
	return nil
}

// Pause snapshots a running sandbox and releases its VM and slot. Without
// keepMemory only its disks are kept (template/catalog/coldboot.go): its resume cold-boots.
func (o *Orchestrator) Pause(ctx context.Context, id string, keepMemory bool) error {
	s, err := o.lockOp(id)
	if err != nil {
		return err
	}
	defer s.op.Unlock()
	if st := o.state(s); st != sandbox.Running {
		return fmt.Errorf("pause sandbox %s: it is %s: %w", id, st, ErrConflict)
	}
	if err := o.pauseLocked(ctx, s, !keepMemory); err != nil {
		return fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	return nil
}

// pauseLocked (op held, sandbox running) pauses s in the durable stages
// of lifecycle.Verbs.Pause: a failure leaves it running as before. A
// filesystem-only pause (fsOnly) has the guest flush its writes first and
// keeps no memory. Once paused its timer stops, its memory image is
// flattened in the background, the repository commits it (hooks.go) and
// its layers are merged when too deep.
func (o *Orchestrator) pauseLocked(ctx context.Context, s *instance, fsOnly bool) error {
	snapDir, err := o.verbs.Pause(ctx, o.live(s), fsOnly)
	if err != nil {
		return err
	}
	o.stopTimer(s)
	rec := o.live(s).Record()
	if fsOnly {
		o.log.Info("sandbox paused without memory", "sandbox", rec.ID)
		o.maybeCompact(rec)
		return nil
	}
	o.mem.FlattenPaused(ctx, rec.ID, snapDir)
	o.log.Info("sandbox paused", "sandbox", rec.ID)
	o.afterPaused(ctx, rec) // the repository's commit (hooks.go)
	o.maybeCompact(rec)
	return nil
}

// Connect makes sure the sandbox runs: a running one gets its end time
// extended to at least now+timeout; a paused one is resumed, from its
// memory image unless memory is false or it has none (a filesystem-only
// pause): then it cold-boots from its disk, and a memory image it has is
// neither used nor changed. resumed reports which.
func (o *Orchestrator) Connect(ctx context.Context, id string, timeout time.Duration, memory bool) (rec sandbox.Record, resumed bool, err error) {
	s, err := o.lockOp(id)
	if errors.Is(err, ErrNotFound) && o.hasMissingHooks() {
		// Paused on another node sharing the repository? (hooks.go)
		if ierr := o.beforeMissingSandbox(ctx, id); ierr != nil {
			return rec, false, ierr
		}
		s, err = o.lockOp(id)
	}
	if err != nil {
		return rec, false, err
	}
	defer s.op.Unlock()
	switch st := o.state(s); st {
	case sandbox.Running:
		s.mu.Lock()
		if end := time.Now().UTC().Add(timeout); end.After(s.rec.EndAt) {
			s.rec.EndAt = end
			o.armTimer(s)
		}
		rec = s.rec
		s.mu.Unlock()
		return rec, false, o.persist(s)
	case sandbox.Paused:
	default:
		return rec, false, fmt.Errorf("connect sandbox %s: it is %s: %w", id, st, ErrConflict)
	}
	// The layers a repository import left remote are fetched once the VM
	// answered (or failed to): the restore reads first.
	defer o.disks.StartLocalize()
	if err := o.resumeLocked(ctx, s, timeout, memory); err != nil {
		return rec, false, fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	s.mu.Lock()
	rec = s.rec
	s.mu.Unlock()
	o.log.Info("sandbox resumed", "sandbox", id)
	return rec, true, nil
}

// resumeLocked (op held, sandbox paused), once admitted, resumes s in the
// stages of lifecycle.Verbs.Resume, its VM brought up by startResume (on a
// warm pool's VM when one fits), and arms its timer. A failure leaves the
// sandbox paused as it was.
func (o *Orchestrator) resumeLocked(ctx context.Context, s *instance, timeout time.Duration, memory bool) error {
	s.mu.Lock()
	mem, id := s.rec.CommittedMemoryMiB(), s.rec.ID
	s.mu.Unlock()
	release, err := o.admit(ctx, "resume", mem, 0)
	if err != nil {
		return err
	}
	defer release()
	// A flatten of the pause still running would only compete with the
	// restore for the disk and CPU: it stops, the restore writes the layers.
	stopFlatten := func() { o.mem.StopFlatten(id) }
	up := func(ctx context.Context, from string, lap func(string)) error {
		return o.startResume(ctx, s, from, lap)
	}
	if err := o.verbs.Resume(ctx, o.live(s), memory, timeout, stopFlatten, up); err != nil {
		return o.resumeFailure(s, err)
	}
	s.mu.Lock()
	o.armTimer(s)
	s.mu.Unlock()
	return nil
}

// SetTimeout sets the end time to now+timeout (it may shorten it). When
// extendOnly, an earlier end than the current one is ignored. It takes the
// operation lock: a pause in flight is never overwritten with an older record.
func (o *Orchestrator) SetTimeout(id string, timeout time.Duration, extendOnly bool) error {
	s, err := o.lockOp(id)
	if err != nil {
		return err
	}
	defer s.op.Unlock()
	end := time.Now().UTC().Add(timeout)
	s.mu.Lock()
	if !extendOnly || end.After(s.rec.EndAt) {
		s.rec.EndAt = end
		if s.rec.State == sandbox.Running {
			o.armTimer(s)
		}
	}
	s.mu.Unlock()
	return o.persist(s)
}

// SetPolicy replaces the sandbox's egress policy, in force at once when it
// runs and kept across pause and resume.
func (o *Orchestrator) SetPolicy(ctx context.Context, id string, p network.Policy) error {
	if err := network.ValidatePolicy(p); err != nil {
		return fmt.Errorf("network policy: %w: %w", err, ErrInvalid)
	}
	s, err := o.lockOp(id)
	if err != nil {
		return err
	}
	defer s.op.Unlock()
	s.mu.Lock()
	slot := s.slot()
	s.mu.Unlock()
	if slot != nil {
		if err := slot.SetPolicy(ctx, p); err != nil {
			return fmt.Errorf("sandbox %s: network policy: %w", id, err)
		}
	}
	return o.update(s, func(r *sandbox.Record) { r.Policy = p })
}

func isZeroPolicy(p network.Policy) bool {
	return !p.DenyInternet && len(p.AllowOut) == 0 && len(p.DenyOut) == 0
}

// armTimer (re)starts the TTL timer; s.mu must be held.
func (o *Orchestrator) armTimer(s *instance) {
	if s.timer != nil {
		s.timer.Stop()
	}
	id := s.rec.ID
	s.timer = time.AfterFunc(time.Until(s.rec.EndAt), func() { o.expire(id) })
}

func (o *Orchestrator) stopTimer(s *instance) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
}

// expire runs when a sandbox's end time passed: pause when autoPause, else
// kill. It decides under the operation lock, so an extension that came
// while it waited for the lock wins.
func (o *Orchestrator) expire(id string) {
	s, err := o.lockOp(id)
	if err != nil {
		return
	}
	defer s.op.Unlock()
	s.mu.Lock()
	rec := s.rec
	s.mu.Unlock()
	if rec.State != sandbox.Running || time.Now().Before(rec.EndAt) {
		return // paused meanwhile, or the end moved (a newer timer is armed)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if rec.AutoPause {
		err = o.pauseLocked(ctx, s, rec.AutoPauseFilesystemOnly)
	} else {
		err = o.killLocked(ctx, s)
	}
	if err != nil {
		o.log.Error("sandbox timeout", "sandbox", id, "autoPause", rec.AutoPause, "err", err)
		return
	}
	o.log.Info("sandbox timed out", "sandbox", id, "autoPause", rec.AutoPause)
}

// handOver leaves a running sandbox to the next start of the node: its VMM
// runs on and its network slot survives the network manager's shutdown;
// the record (running, with its slot and VMM) lets Recover re-adopt both.
func (o *Orchestrator) handOver(id string) {
	s, err := o.lockOp(id)
	if err != nil {
		return
	}
	defer s.op.Unlock()
	s.mu.Lock()
	slot := s.slot()
	s.mu.Unlock()
	if slot != nil {
		o.nets.Detach(slot)
	}
	o.log.Info("sandbox left running for the next start", "sandbox", id)
}

func (o *Orchestrator) state(s *instance) sandbox.State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rec.State
}

// Shutdown pauses every running sandbox (pause true) or leaves them
// running for the next start to re-adopt. It never kills one: a sandbox
// whose pause fails runs on with its slot handed over to the next start
// (and is counted and logged); paused ones stay paused. Background work is
// waited for.
func (o *Orchestrator) Shutdown(ctx context.Context, pause bool) error {
	defer o.Close()
	o.unwatch() // a VMM that ends from here on is the next start's
	var failed int
	for _, r := range o.List() {
		if r.State != sandbox.Running {
			continue
		}
		if !pause {
			o.handOver(r.ID)
			continue
		}
		err := o.Pause(ctx, r.ID, true)
		switch {
		case err == nil, errors.Is(err, ErrNotFound), errors.Is(err, ErrConflict):
			// paused, gone meanwhile, or no longer running (an auto-pause)
		default:
			failed++
			o.handOver(r.ID)
			o.log.Error("shutdown: pause failed; the sandbox is left running for the next start", "sandbox", r.ID, "err", err)
		}
	}
	if failed > 0 {
		return fmt.Errorf("shutdown: %d sandboxes could not be paused and were left running", failed)
	}
	return nil
}
