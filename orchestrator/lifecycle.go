package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/vmm"
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

// killLocked (op held) records "killing", then removes the VM, the slot,
// the device, the directory and finally the record; recovery finishes a
// kill a crash interrupted.
func (o *Orchestrator) killLocked(ctx context.Context, s *instance) (err error) {
	done := o.m.Observe("kill")
	defer func() { done(err) }()
	id := s.rec.ID
	if o.state(s) == sandbox.Running && sandbox.WritesVolumes(s.rec) {
		o.freezeVolumes(ctx, s) // what it flushes is what its volumes keep
	}
	if err := o.transition(s, sandbox.Killing, nil); err != nil {
		return fmt.Errorf("kill sandbox %s: %w", id, err)
	}
	o.stopTimer(s)
	tmpl := s.rec.TemplateID
	if err := o.remove(ctx, s); err != nil {
		return fmt.Errorf("kill sandbox %s: %w", id, err)
	}
	o.log.Info("sandbox killed", "sandbox", id)
	o.collectForkSnapshot(tmpl)
	return nil
}

// Pause snapshots a running sandbox and releases its VM and slot. Without
// keepMemory only its disks are kept (coldboot.go): its resume cold-boots.
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

// pauseLocked (op held, sandbox running) pauses in durable steps: record
// "pausing"; stop the vCPUs; read the memory diff while the disks' uppers
// are sealed, then write the VM state (captureAndSeal); record "paused" pointing at
// both; only then stop the VMM and release the slot and the device. Up to
// the "paused" record any failure resumes the VM and the sandbox runs on
// as before (nothing is lost); after it, what is left is cleanup that
// recovery redoes. A filesystem-only pause (fsOnly) has the guest flush
// its writes first and writes no memory: its "paused" record points at no
// snapshot, and the one a previous resume came from goes.
func (o *Orchestrator) pauseLocked(ctx context.Context, s *instance, fsOnly bool) (err error) {
	done, lap := o.m.Observe("pause"), o.m.Stage("pause")
	defer func() { done(err) }()
	s.mu.Lock()
	rec := s.rec
	s.mu.Unlock()
	// A disk still reading layers from the repository is sealed once they
	// are files here (its seal and upload list them): wait, VM running.
	if err := o.settleDisks(ctx, rec); err != nil {
		return err
	}
	if fsOnly {
		o.syncGuest(ctx, s)
	}
	if err := o.transition(s, sandbox.Pausing, func(r *sandbox.Record) { r.FilesystemOnly = fsOnly }); err != nil {
		if o.state(s) != sandbox.Pausing {
			return err // nothing recorded
		}
		return o.resumeAfterFailedPause(ctx, s, nil, err)
	}
	s.mu.Lock()
	vm, rec, id := s.machine(), s.rec, s.rec.ID
	s.mu.Unlock()
	if err := vm.Pause(ctx); err != nil {
		return o.resumeAfterFailedPause(ctx, s, nil, err)
	}
	lap("stop_vcpus")
	sealedFrom := rec.DiskConfigs()
	var snapDir string
	unseal := func(err error) error {
		// The devices kept their uppers (keepUpper): the VM runs on on
		// them, and the record names their configs again.
		s.mu.Lock()
		s.rec.SetDiskConfigs(sealedFrom)
		s.mu.Unlock()
		return o.resumeAfterFailedPause(ctx, s, vm, err, snapDir)
	}
	snapDir, err = o.captureAndSeal(ctx, s, rec, vm, fsOnly)
	if err != nil {
		return unseal(err)
	}
	lap("capture_seal")
	var old string
	err = o.transition(s, sandbox.Paused, func(r *sandbox.Record) {
		old, r.Snapshot = r.Snapshot, snapDir
		if fsOnly {
			r.Memory = snapshot.MemoryImage{} // nothing maps or keeps one
		}
	})
	if err != nil {
		return unseal(err)
	}
	lap("record")
	o.stopTimer(s)
	o.stopVM(ctx, s)
	_ = fpPauseStopped.Inject()
	lap("stop_vmm")
	o.releaseDevice(ctx, s)
	if err := o.persist(s); err != nil {
		o.log.Warn("record paused sandbox without its VMM (recovery redoes it)", "sandbox", id, "err", err)
	}
	lap("release")
	if old != "" && old != snapDir {
		_ = os.RemoveAll(old)
	}
	s.mu.Lock()
	rec = s.rec
	s.mu.Unlock()
	if fsOnly {
		sandbox.DropMemoryLayers(rec.Dir)
		o.log.Info("sandbox paused without memory", "sandbox", id)
		o.maybeCompact(rec)
		return nil
	}
	o.mem.FlattenPaused(ctx, id, snapDir)
	o.log.Info("sandbox paused", "sandbox", id)
	o.afterPaused(ctx, rec) // the repository's commit (hooks.go)
	o.maybeCompact(rec)
	return nil
}

// captureAndSeal (vCPUs stopped) writes the pause's snapshot of memory and
// VM state (none when fsOnly) and seals the disks' uppers. The memory diff
// is read while the disks are sealed: they touch different files and
// daemons, and neither needs the other. The VM state is written only once
// the seal succeeded (writing it drains the VM's drives; see captureVM). A
// seal without the "paused" record is a state recovery already handles
// (the VM continues on the restacked disks, as after a failed drive seal).
// It returns the snapshot directory, also on error when the capture wrote it.
func (o *Orchestrator) captureAndSeal(ctx context.Context, s *instance, rec sandbox.Record, vm vmm.Machine, fsOnly bool) (string, error) {
	sealed := make(chan struct{})
	var sealErr error
	go func() {
		defer close(sealed)
		start := time.Now()
		sealErr = o.sealDisks(ctx, s, rec)
		o.log.Debug("disks sealed", "sandbox", rec.ID, "took", time.Since(start).Round(time.Millisecond), "err", sealErr)
	}()
	waitSeal := func() error { <-sealed; return sealErr }
	var snapDir string
	var captureErr error
	if !fsOnly {
		if snapDir, captureErr = sandbox.CapturePause(ctx, o.log, rec, vm, waitSeal); captureErr == nil {
			captureErr = fpPauseCaptured.Inject()
		}
	}
	if err := waitSeal(); err != nil && !errors.Is(captureErr, err) {
		captureErr = errors.Join(captureErr, err)
	}
	return snapDir, captureErr
}

// sealDisks seals the root disk's upper and the writable drives' (vCPUs
// stopped).
func (o *Orchestrator) sealDisks(ctx context.Context, s *instance, rec sandbox.Record) error {
	if err := o.sealRootfs(ctx, s); err != nil {
		return fmt.Errorf("seal disk: %w", err)
	}
	if err := o.sealSandboxDrives(ctx, s, fmt.Sprint(rec.Gen), "sandbox "+rec.ID); err != nil {
		return fmt.Errorf("seal drives: %w", err)
	}
	return fpPauseSealed.Inject()
}

// resumeAfterFailedPause lets the VM continue (vm nil: its vCPUs never
// stopped), records the sandbox running again and returns cause; the
// partial snapshot directories go.
func (o *Orchestrator) resumeAfterFailedPause(ctx context.Context, s *instance, vm vmm.Machine, cause error, partial ...string) error {
	ctx = context.WithoutCancel(ctx)
	var rerr error
	if vm != nil {
		if rerr = vm.Resume(ctx); rerr != nil {
			rerr = fmt.Errorf("resume the VM: %w", rerr)
		}
	}
	for _, p := range partial {
		_ = os.RemoveAll(p)
	}
	if err := o.transition(s, sandbox.Running, func(r *sandbox.Record) { r.FilesystemOnly = false }); err != nil {
		rerr = errors.Join(rerr, err)
	}
	s.mu.Lock()
	id := s.rec.ID
	s.mu.Unlock()
	o.log.Error("pause failed; the sandbox runs on", "sandbox", id, "err", cause, "resume_err", rerr)
	return errors.Join(cause, rerr)
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

// resumeLocked (op held, sandbox paused) records "resuming" (and whether
// it cold-boots), brings the VM up from the paused snapshot or boots its
// disk, and records "running". A failure leaves the sandbox paused as it
// was, on the same snapshot if it has one.
func (o *Orchestrator) resumeLocked(ctx context.Context, s *instance, timeout time.Duration, memory bool) (err error) {
	done := o.m.Observe("resume")
	defer func() { done(err) }()
	s.mu.Lock()
	mem := s.rec.MemoryMiB
	s.mu.Unlock()
	release, err := o.admit(ctx, "resume", mem, 0)
	if err != nil {
		return err
	}
	defer release()
	if err := o.transition(s, sandbox.Resuming, func(r *sandbox.Record) { r.ColdBoot = !memory || r.FilesystemOnly }); err != nil {
		if o.state(s) != sandbox.Resuming {
			return err // nothing recorded
		}
		return errors.Join(err, o.transition(s, sandbox.Paused, nil))
	}
	s.mu.Lock()
	from, id := s.rec.Snapshot, s.rec.ID
	if s.rec.ColdBoot {
		from = ""
	}
	s.mu.Unlock()
	// A flatten of the pause still running would only compete with the
	// restore for the disk and CPU: it stops, the restore writes the layers.
	o.mem.StopFlatten(id)
	if err := o.startResume(ctx, s, from, o.m.Stage("resume")); err != nil {
		return errors.Join(err, o.transition(s, sandbox.Paused, func(r *sandbox.Record) { r.PID, r.PIDStart, r.PoolClaim = 0, 0, false }))
	}
	if err := o.mountVolumes(ctx, s); err != nil {
		o.log.Warn("resume: the guest did not mount its volumes", "sandbox", s.rec.ID, "err", err)
	}
	err = o.transition(s, sandbox.Running, func(r *sandbox.Record) { r.EndAt, r.FilesystemOnly = time.Now().UTC().Add(timeout), false })
	if err != nil {
		return err
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
