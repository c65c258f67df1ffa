package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/agentenv/agentenv/disk"
	"github.com/agentenv/agentenv/telemetry"
	"github.com/agentenv/agentenv/template"

	"github.com/agentenv/agentenv/internal/ids"
	"github.com/agentenv/agentenv/internal/vmmproc"
	"github.com/agentenv/agentenv/lifecycle"
	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/warmpool"
)

// CreateOptions describe a new sandbox.
type CreateOptions struct {
	TemplateID string
	Timeout    time.Duration
	AutoPause  bool
	AutoResume bool
	Secure     bool
	Metadata   map[string]string
	EnvVars    map[string]string
	Policy     network.Policy
	// PrivateTraffic requires a traffic access token on the proxy.
	PrivateTraffic bool
	// MaskRequestHost is the Host header proxied requests carry ("" keeps
	// the client's).
	MaskRequestHost string
	// Drives are extra block drives in the template's free drive slots
	// (drives.go).
	Drives []disk.DriveRequest
	// Volumes are the volumes mounted in the guest, each in a free drive
	// slot after Drives (volumes.go).
	Volumes []VolumeMount
	// AutoPauseFilesystemOnly makes the timeout's auto-pause keep only the
	// disks (template/catalog/coldboot.go); it cannot go with AutoResume, since traffic
	// cannot resume a sandbox without memory in place.
	AutoPauseFilesystemOnly bool
}

// Create restores the template's (or snapshot's) snapshot into a new sandbox.
//
// The node's part: the options checked, the source brought (hooks.go) and
// resolved, the sandbox registered (its operation lock held) and admitted;
// then the stages of lifecycle.Verbs.Create, each durable before the next:
// the "starting" record (so a crash from here on is rolled back by
// recovery), the VM bring-up (startCreate), the "running" record. Any
// failure undoes everything. Once it runs, its timer is armed.
func (o *Orchestrator) Create(ctx context.Context, opts CreateOptions) (rec sandbox.Record, err error) {
	if err := checkCreate(opts); err != nil {
		return rec, err
	}
	done := o.m.Observe("create")
	defer func() { done(err) }()
	// Layers a repository import left remote are fetched once the VM
	// answered (disk/lazy.go).
	defer o.disks.StartLocalize()
	// The node's builtin templates (code-interpreter-v1) build on first use.
	if err := o.catalog.EnsureBuiltin(ctx, opts.TemplateID); err != nil {
		return rec, fmt.Errorf("create: %w", err)
	}
	if err := o.bringSource(ctx, opts.TemplateID); err != nil {
		return rec, err
	}
	s, t, release, err := o.registerAdmitted(ctx, opts)
	if err != nil {
		return rec, err
	}
	defer release() // after the sandbox runs or is gone (defers run last first)
	defer s.op.Unlock()
	err = o.verbs.Create(ctx, live{o, s}, lifecycle.Creation{
		From: t.Snapshot, RootfsImage: t.RootfsImage, Timeout: opts.Timeout, Removal: o.removal(s),
		Up: func(ctx context.Context, _ string, lap func(string)) error {
			return o.startCreate(ctx, s, t, lap) // from t.Snapshot
		},
	})
	if err != nil {
		return rec, fmt.Errorf("create sandbox %s: %w", s.rec.ID, err)
	}
	s.mu.Lock()
	o.armTimer(s)
	rec = s.rec
	s.mu.Unlock()
	o.log.Info("sandbox created", "sandbox", rec.ID, "template", t.ID)
	return rec, nil
}

// checkCreate refuses options no create can run with.
func checkCreate(opts CreateOptions) error {
	if opts.Timeout <= 0 {
		return fmt.Errorf("create: timeout must be positive: %w", ErrInvalid)
	}
	if err := network.ValidatePolicy(opts.Policy); err != nil {
		return fmt.Errorf("create: network policy: %w: %w", err, ErrInvalid)
	}
	if err := disk.CheckDrives(opts.Drives); err != nil {
		return fmt.Errorf("create: %w", err)
	}
	if err := disk.CheckVolumeMounts(opts.Volumes); err != nil {
		return fmt.Errorf("create: %w", err)
	}
	if opts.AutoPauseFilesystemOnly && opts.AutoResume {
		return fmt.Errorf("create: autoResume cannot be combined with a filesystem-only auto-pause (autoPauseMemory false): such a sandbox must be resumed explicitly: %w", ErrInvalid)
	}
	return nil
}

// registerAdmitted registers the new sandbox (register) and admits it:
// the host's free memory and the node's admission (admission.go). On
// failure the sandbox left the registry again; on success its operation
// lock is held and release gives its admission back.
func (o *Orchestrator) registerAdmitted(ctx context.Context, opts CreateOptions) (*instance, *template.Template, func(), error) {
	s, t, err := o.register(opts)
	if err != nil {
		return nil, nil, nil, err
	}
	release := func() {}
	if err = o.checkMemory(t.MemoryMiB); err == nil {
		release, err = o.admit(ctx, "create", s.rec.CommittedMemoryMiB(), 0)
	}
	if err != nil {
		o.unregister(s)
		return nil, nil, nil, err
	}
	return s, t, release, nil
}

// bringSource runs the before-hooks that bring a snapshot or template
// committed by another node here when this node knows no template or
// snapshot of that id or name (hooks.go); outside refMu, which the fetch
// would hold for long.
func (o *Orchestrator) bringSource(ctx context.Context, id string) error {
	if !o.hasMissingHooks() {
		return nil
	}
	if _, err := o.source(id); !errors.Is(err, ErrNotFound) {
		return nil
	}
	return o.beforeMissingSource(ctx, id)
}

// register resolves the create's source and enters the new sandbox, in
// state starting and with its operation lock held, into the registry, both
// under refMu: a deletion of the source either happened before (the create
// fails with not found) or sees the sandbox.
func (o *Orchestrator) register(opts CreateOptions) (*instance, *template.Template, error) {
	id, err := ids.New()
	if err != nil {
		return nil, nil, err
	}
	o.refMu.Lock()
	defer o.refMu.Unlock()
	t, err := o.source(opts.TemplateID)
	if err != nil {
		return nil, nil, err
	}
	vols, err := o.disks.AcquireVolumes(o.volumes, id, opts.Volumes)
	if err != nil {
		return nil, nil, err
	}
	drives, err := disk.PlanDrives(t, append(slices.Clone(opts.Drives), vols...), o.source)
	if err != nil {
		for _, v := range vols {
			o.disks.ReleaseVolume(o.volumes, v.Volume.ID, id)
		}
		return nil, nil, err
	}
	dir := filepath.Join(o.cfg.DataDir, "sandboxes", id)
	s := &instance{rec: sandbox.Record{
		ID: id, TemplateID: t.ID, State: sandbox.Starting, Metadata: opts.Metadata, EnvVars: opts.EnvVars,
		AutoPause: opts.AutoPause, AutoResume: opts.AutoResume, Secure: opts.Secure,
		VCPUs: t.VCPUs, MemoryMiB: t.MemoryMiB, MemoryTargetMiB: t.MemoryTargetMiB, DiskMiB: t.DiskMiB, EnvdVersion: t.EnvdVersion,
		Dir: dir, Policy: opts.Policy, GuestToken: t.GuestToken, DriveSlots: t.DriveSlots, Drives: drives,
	}}
	// Every sandbox's agent gets an access token, so a packet that reached
	// the agent around the proxy would still be refused. A secure sandbox's
	// client holds it (E2B's envdAccessToken); otherwise only the proxy
	// knows it and presents it.
	if s.rec.AccessToken, err = ids.Hex(32); err != nil {
		return nil, nil, err
	}
	s.rec.MaskRequestHost = opts.MaskRequestHost
	s.rec.AutoPauseFilesystemOnly = opts.AutoPause && opts.AutoPauseFilesystemOnly
	if opts.PrivateTraffic {
		if s.rec.TrafficToken, err = ids.Hex(32); err != nil {
			return nil, nil, err
		}
	}
	s.op.Lock()
	o.mu.Lock()
	o.sandboxes[id] = s
	o.mu.Unlock()
	return s, t, nil
}

// checkMemory refuses a create the host's free memory cannot hold.
func (o *Orchestrator) checkMemory(mib int) error {
	_, availKiB, err := telemetry.MemInfo()
	if err != nil || availKiB <= 0 {
		return nil // unknown: let the VMM try
	}
	if needKiB := int64(mib) << 10; availKiB < needKiB {
		return fmt.Errorf("create: %d MiB of guest memory asked, %d MiB available: %w", mib, availKiB>>10, ErrCapacity)
	}
	return nil
}

// unregister takes a sandbox that never started out of the registry.
func (o *Orchestrator) unregister(s *instance) {
	o.unlist(s)
	s.op.Unlock()
}

// remove (op held) stops the sandbox's VM, releases its slot and device
// and deletes its registry entry, directory and, last, its record
// (lifecycle.Verbs.Remove).
func (o *Orchestrator) remove(ctx context.Context, s *instance) error {
	return o.verbs.Remove(ctx, o.live(s), o.removal(s))
}

// unlist marks the sandbox gone and takes it out of the registry.
func (o *Orchestrator) unlist(s *instance) {
	s.mu.Lock()
	s.gone = true
	s.mu.Unlock()
	o.mu.Lock()
	delete(o.sandboxes, s.rec.ID)
	o.mu.Unlock()
}

// startCreate brings a new sandbox's VM up from t's snapshot: on a warm
// pool's VM when one fits (takeEntry, pool.go), else by a restore of its
// own.
func (o *Orchestrator) startCreate(ctx context.Context, s *instance, t *template.Template, lap func(string)) error {
	if o.pool != nil {
		if e := o.takeEntry(ctx, s, t); e != nil {
			return o.startPooled(ctx, s, t.Snapshot, lap, e)
		}
	}
	return o.startVM(ctx, s, t.Snapshot, lap)
}

// startResume brings a paused sandbox's VM up from its snapshot vmDir
// ("": a cold boot): on a warm pool's VM when one fits (takeRebased,
// poolresume.go), else by a restore of its own.
func (o *Orchestrator) startResume(ctx context.Context, s *instance, vmDir string, lap func(string)) error {
	if o.pool != nil {
		if e := o.takeRebased(ctx, s, vmDir); e != nil {
			return o.startPooled(ctx, s, vmDir, lap, e)
		}
	}
	return o.startVM(ctx, s, vmDir, lap)
}

// startVM brings the sandbox's VM up from snapshotDir, or cold-boots its
// disk when the record says ColdBoot (op held): one
// sandbox.Start with the sandbox's disk, memory image and agent /init, the
// generation recorded before the VMM starts and its pid + start time right
// after. On failure nothing is left running. lap records the stages'
// latencies.
func (o *Orchestrator) startVM(ctx context.Context, s *instance, snapshotDir string, lap func(string)) error {
	return o.startVMFrom(ctx, s, snapshotDir, lap, nil)
}

// startVMFrom is startVM taking the VM of pool entry e (nil: none) instead
// of starting one: the first record names what e holds, the claim is
// finished (takeOver), and the bring-up continues e's VM (pool.go).
func (o *Orchestrator) startVMFrom(ctx context.Context, s *instance, snapshotDir string, lap func(string), e *warmpool.Entry) error {
	// The generation names the run directory: recovery finds the VMM there.
	if err := o.update(s, func(r *sandbox.Record) { r.Gen++; claimEntry(r, e) }); err != nil {
		o.dropEntry(ctx, s, e)
		return err
	}
	if err := o.takeOver(ctx, s, e); err != nil {
		o.dropEntry(ctx, s, e)
		return err
	}
	rec := o.live(s).Record()
	var mem snapshot.MemoryImage
	prefetched := func() {}
	defer func() { prefetched() }()
	spec := o.vmSpec(s, rec, snapshotDir, lap)
	spec.Memory = func(ctx context.Context) (sandbox.Memory, error) {
		var vm sandbox.Memory
		var err error
		mem, vm, err = o.mem.VMMemory(ctx, snapshotDir, vmName(rec))
		if err != nil {
			return vm, err
		}
		var remote bool
		if prefetched, remote = o.mem.Prefetch(mem.File); remote {
			wait := prefetched
			vm.Ready = func(context.Context) { wait() }
		}
		return vm, nil
	}
	if rec.ColdBoot {
		if err := o.catalog.ColdBoot(&spec, rec); err != nil {
			return err
		}
	}
	if e != nil {
		spec.Pooled = e.VM
	}
	vm, err := sandbox.Start(ctx, o.vms, spec)
	if errors.Is(err, network.ErrExhausted) {
		return fmt.Errorf("%w: %w", err, ErrCapacity)
	}
	if err != nil {
		return err
	}
	o.log.Debug("vm started", "sandbox", rec.ID, "gen", rec.Gen, "slot", vm.Slot.Name, "pid", vm.Machine.Info().PID, "memory", mem.File)
	o.keepVM(s, vm, mem)
	return nil
}

// vmSpec is the bring-up of the sandbox's VM (record rec) from
// snapshotDir, but for its memory: the disk and drives record their
// devices in s, /init carries the sandbox's env, user, fresh drives and
// token, the "storage" stage fires its fault point, and the VMM's pid and
// start time are recorded once it started.
func (o *Orchestrator) vmSpec(s *instance, rec sandbox.Record, snapshotDir string, lap func(string)) sandbox.Spec {
	spec := sandbox.Spec{
		ID: vmName(rec), RunDir: filepath.Join(rec.Dir, fmt.Sprintf("run-%d", rec.Gen)),
		Policy: rec.Policy, Disk: vmDisk{o, s}, Drives: o.vmDrives(s, rec), Restore: snapshotDir, VCPUs: rec.VCPUs, MemoryMiB: rec.MemoryMiB,
		Init:     &sandbox.InitRequest{EnvVars: rec.EnvVars, DefaultUser: o.catalog.DefaultUser(rec.TemplateID), Drives: disk.FreshDisks(rec)},
		InitHeld: rec.GuestToken,
		Log:      o.log,
		Stage: func(name string) error {
			lap(name)
			if name == "storage" {
				return fpCreateDisk.Inject()
			}
			return nil
		},
		Started: func(m vmm.Machine) error {
			if err := o.pointAfterRestore(s).Inject(); err != nil {
				return err
			}
			pctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			o.repin(pctx, rec, m, false)
			o.retarget(pctx, rec, m, false)
			cancel()
			pid := m.Info().PID
			if err := o.update(s, func(r *sandbox.Record) { r.PID, r.PIDStart, r.PoolClaim = pid, vmmproc.Start(pid), false }); err != nil {
				return err
			}
			return fpCreateVMM.Inject()
		},
	}
	if rec.AccessToken != "" || rec.GuestToken != "" {
		token := rec.AccessToken
		spec.Init.AccessToken = &token // "" clears a token the snapshot's sandbox had
	}
	return spec
}

// keepVM makes the started vm (on memory image mem) the sandbox's: its
// slot, memory and the token its agent now holds go into the record (the
// next write persists them), its drives count as probed, and the working
// set of its memory is recorded.
func (o *Orchestrator) keepVM(s *instance, vm *sandbox.VM, mem snapshot.MemoryImage) {
	s.mu.Lock()
	s.vm, s.rec.Memory, s.rec.Slot = vm, mem, vm.Slot.Index
	s.rec.GuestToken = s.rec.AccessToken
	for i := range s.rec.Drives {
		s.rec.Drives[i].Fresh = false // probed at this /init
	}
	if vm.EnvdVersion != "" { // what the agent says it speaks, not what the template was built with
		s.rec.EnvdVersion = vm.EnvdVersion
	}
	id := s.rec.ID
	s.mu.Unlock()
	o.watchVM(s, vm)
	o.mem.RecordWorkingSet(id, vm.Machine, mem.File)
}

// pointAfterRestore is the fault point right after the VMM started: a
// create's, a resume's or a cold resume's.
func (o *Orchestrator) pointAfterRestore(s *instance) interface{ Inject() error } {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rec.State == sandbox.Resuming && s.rec.ColdBoot {
		return fpResumeBooted
	}
	if s.rec.State == sandbox.Resuming {
		return fpResumeRestored
	}
	return fpCreateRestored
}

// stopVM stops the machine and releases the slot of s (any state); the
// disk stays (releaseDevice).
func (o *Orchestrator) stopVM(ctx context.Context, s *instance) {
	s.mu.Lock()
	vm := s.vm
	s.vm, s.rec.PID, s.rec.PIDStart, s.rec.Slot = nil, 0, 0, 0
	id := s.rec.ID
	s.mu.Unlock()
	if vm == nil {
		return
	}
	if err := vm.Stop(ctx); err != nil {
		o.log.Warn("stop vm", "sandbox", id, "err", err)
	}
}

// vmName names the VM of the sandbox's current generation (its VMM process
// and control group carry it).
func vmName(r sandbox.Record) string { return fmt.Sprintf("%s-%d", r.ID, r.Gen) }
