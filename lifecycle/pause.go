package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/agentenv/agentenv/disk"
	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/vmm"
)

// The pause's fault points, between its durable steps (the journal fires
// orchestrator/pause/recorded and .../paused). Their names keep the
// orchestrator's prefix: the crash matrix (api/e2e) names them.
var (
	fpPauseCaptured = failpoint.New("orchestrator/pause/captured") // memory and VM state written (the disks sealed first), vCPUs stopped
	fpPauseSealed   = failpoint.New("orchestrator/pause/sealed")   // the disks' uppers are sealed layers (the memory diff may still be read)
	fpPauseStopped  = failpoint.New("orchestrator/pause/stopped")  // the VMM is gone, the device not yet
)

// Pause snapshots the sandbox's VM and releases it, in stages:
//
//	settle        the memory and disk layers a repository import left
//	              remote are local files (the capture and the seal list
//	              them); the VM runs
//	sync          a filesystem-only pause (fsOnly) has the guest flush
//	record        "pausing" (undo: "running" again)
//	stop_vcpus    the VM's vCPUs stop (undo: they continue)
//	capture_seal  the memory diff is read while the disks' uppers are
//	              sealed, then the VM state is written (none when fsOnly;
//	              undo: the record names the unsealed disks again, the
//	              partial snapshot goes)
//	record        "paused", pointing at the snapshot and the sealed disks:
//	              the commit point
//	stop_vmm      the VMM stops, the slot goes back
//	release       the devices are deleted and the record says so
//	tidy          the snapshot a previous resume came from goes, and a
//	              filesystem-only pause drops the memory layers
//
// Up to the "paused" record a failure runs the undo stack: a serving
// sandbox runs on as before (nothing is lost). An adopted VM (recovery)
// skips settle, sync and the "pausing" record (its record says what a
// crash interrupted) and is not continued: its caller stops it. Pause
// returns the new snapshot directory ("" when fsOnly).
func (v *Verbs) Pause(ctx context.Context, s Sandbox, fsOnly bool) (snapDir string, err error) {
	done, lap := v.observe(s, "pause")
	defer func() { done(err) }()
	var undo undoStack
	fail := func(cause error) error {
		if s.Adopted() {
			undo.run(context.WithoutCancel(ctx))
			return fmt.Errorf("pause adopted machine: %w", cause)
		}
		rerr := errors.Join(undo.run(context.WithoutCancel(ctx))...)
		v.Log.Error("pause failed; the sandbox runs on", "sandbox", s.Record().ID, "err", cause, "resume_err", rerr)
		return errors.Join(cause, rerr)
	}
	if err := v.localMemory(ctx, s); err != nil {
		return "", err
	}
	if !s.Adopted() {
		if err := v.settle(ctx, s.Record()); err != nil {
			return "", err
		}
		if fsOnly {
			v.syncGuest(ctx, s)
		}
		if err := s.Transition(sandbox.Pausing, func(r *sandbox.Record) { r.FilesystemOnly = fsOnly }); err != nil {
			if s.Record().State != sandbox.Pausing {
				return "", err // nothing recorded
			}
			undo.add(recordRunning(s))
			return "", fail(err)
		}
		undo.add(recordRunning(s))
	}
	vm := s.Machine()
	if err := vm.Pause(ctx); err != nil {
		return "", fail(err)
	}
	if !s.Adopted() {
		undo.add(func(ctx context.Context) error {
			if err := vm.Resume(ctx); err != nil {
				return fmt.Errorf("resume the VM: %w", err)
			}
			return nil
		})
	}
	lap("stop_vcpus")
	sealedFrom := s.Record().DiskConfigs()
	undo.add(func(context.Context) error {
		// The devices kept their uppers (KeepUpper): the VM runs on on
		// them, and the record names their configs again.
		s.Set(func(r *sandbox.Record) { r.SetDiskConfigs(sealedFrom) })
		if snapDir != "" {
			_ = os.RemoveAll(snapDir)
		}
		return nil
	})
	if snapDir, err = v.captureAndSeal(ctx, s, vm, fsOnly); err != nil {
		return "", fail(err)
	}
	lap("capture_seal")
	old, err := recordPaused(s, snapDir, fsOnly)
	if err != nil {
		return "", fail(err)
	}
	lap("record")
	return snapDir, v.afterPaused(ctx, s, old, snapDir, lap)
}

// recordPaused records "paused" (the pause's commit point) pointing at
// snapDir ("" when fsOnly: no memory is kept), and returns the snapshot
// the record named before (a previous resume's, which goes next).
func recordPaused(s Sandbox, snapDir string, fsOnly bool) (old string, err error) {
	err = s.Transition(sandbox.Paused, func(r *sandbox.Record) {
		old, r.Snapshot, r.FilesystemOnly = r.Snapshot, snapDir, fsOnly
		if fsOnly {
			r.Memory = snapshot.MemoryImage{} // nothing maps or keeps one
		}
	})
	return old, err
}

// afterPaused runs the stages after the commit point: stop_vmm, release,
// tidy. Their failures are logged (recovery redoes them); an adopted
// VM's record that cannot be written is its caller's error.
func (v *Verbs) afterPaused(ctx context.Context, s Sandbox, old, snapDir string, lap func(string)) error {
	s.StopVM(ctx)
	_ = inject(s, fpPauseStopped)
	lap("stop_vmm")
	s.ReleaseDevices(ctx)
	if err := s.Update(func(*sandbox.Record) {}); err != nil {
		if s.Adopted() {
			return err
		}
		v.Log.Warn("record paused sandbox without its VMM (recovery redoes it)", "sandbox", s.Record().ID, "err", err)
	}
	lap("release")
	if old != "" && old != snapDir {
		_ = os.RemoveAll(old)
	}
	if rec := s.Record(); rec.FilesystemOnly {
		sandbox.DropMemoryLayers(rec.Dir)
	}
	return nil
}

// recordRunning is the undo of the "pausing" record.
func recordRunning(s Sandbox) func(context.Context) error {
	return func(context.Context) error {
		return s.Transition(sandbox.Running, func(r *sandbox.Record) { r.FilesystemOnly = false })
	}
}

// settle waits until the layers of rec's root disk and drives are files
// here (disk.Manager.Settle).
func (v *Verbs) settle(ctx context.Context, rec sandbox.Record) error {
	cfgs := []string{rec.RootfsImage}
	for _, d := range rec.Drives {
		cfgs = append(cfgs, d.Config)
	}
	return v.Disks.Settle(ctx, cfgs...)
}

// localMemory names the memory layers of s by local files where a
// repository import left them remote (disk.Manager.LocalMemory): a
// capture reads the top layer and lists them all. In the record in memory
// only; the next transition persists it (the layers are the same either
// way).
func (v *Verbs) localMemory(ctx context.Context, s Sandbox) error {
	rec := s.Record()
	m, err := v.Disks.LocalMemory(ctx, rec.Memory, rec.Dir)
	if err != nil {
		return fmt.Errorf("memory layers of sandbox %s: %w", rec.ID, err)
	}
	if !slices.Equal(m.Layers, rec.Memory.Layers) {
		s.Set(func(r *sandbox.Record) { r.Memory = m })
	}
	return nil
}

// syncGuest has the running guest flush its writes to its disks. A
// failure is logged, not returned: the pause goes on, and what the guest
// had not flushed is lost as in a crash.
func (v *Verbs) syncGuest(ctx context.Context, s Sandbox) {
	slot, rec := s.Slot(), s.Record()
	if slot == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, sandbox.GuestSyncWait)
	defer cancel()
	if err := sandbox.SyncGuest(ctx, slot, rec.GuestToken); err != nil {
		v.Log.Warn("guest did not flush before a filesystem-only pause; its unflushed writes are lost as in a crash",
			"sandbox", rec.ID, "err", err)
	}
}

// captureAndSeal (vCPUs stopped) writes the pause's snapshot of memory and
// VM state (none when fsOnly) and seals the disks' uppers. The memory diff
// is read while the disks are sealed: they touch different files and
// daemons, and neither needs the other. The VM state is written only once
// the seal succeeded (writing it drains the VM's drives; see
// sandbox.CaptureVM). A seal without the "paused" record is a state
// recovery already handles (the VM continues on the restacked disks, as
// after a failed drive seal). It returns the snapshot directory, also on
// error when the capture wrote it.
func (v *Verbs) captureAndSeal(ctx context.Context, s Sandbox, vm vmm.Machine, fsOnly bool) (string, error) {
	rec := s.Record()
	sealed := make(chan struct{})
	var sealErr error
	go func() {
		defer close(sealed)
		start := time.Now()
		sealErr = v.sealDisks(ctx, s)
		v.Log.Debug("disks sealed", "sandbox", rec.ID, "took", time.Since(start).Round(time.Millisecond), "err", sealErr)
	}()
	waitSeal := func() error { <-sealed; return sealErr }
	var snapDir string
	var captureErr error
	if !fsOnly {
		if snapDir, captureErr = sandbox.CapturePause(ctx, v.Log, rec, vm, waitSeal); captureErr == nil {
			captureErr = inject(s, fpPauseCaptured)
		}
	}
	if err := waitSeal(); err != nil && !errors.Is(captureErr, err) {
		captureErr = errors.Join(captureErr, err)
	}
	return snapDir, captureErr
}

// sealDisks (vCPUs stopped) seals the root disk's upper and the writable
// drives' (their devices keep the uppers, deleted next) and points the
// record (in memory; the "paused" record persists it) at the sealed
// configs. A seal a crash interrupted is finished, not repeated.
func (v *Verbs) sealDisks(ctx context.Context, s Sandbox) error {
	rec := s.Record()
	cfg, err := v.Disks.SealDevice(ctx, rec, fmt.Sprintf("rootfs-%d", rec.Gen), "sandbox "+rec.ID, disk.KeepUpper)
	if err != nil {
		return fmt.Errorf("seal disk: %w", err)
	}
	s.Set(func(r *sandbox.Record) { r.RootfsImage = cfg })
	if len(rec.Drives) > 0 {
		drives, err := v.Disks.SealDrives(ctx, rec, fmt.Sprint(rec.Gen), "sandbox "+rec.ID, disk.KeepUpper)
		if err != nil {
			return fmt.Errorf("seal drives: %w", err)
		}
		s.Set(func(r *sandbox.Record) {
			for i := range r.Drives {
				r.Drives[i].Config = drives[i].Config
			}
		})
	}
	return inject(s, fpPauseSealed)
}
