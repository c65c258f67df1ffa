package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/store"
	"github.com/agentenv/agentenv/vmm"
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
}

// Create restores the template's (or snapshot's) snapshot into a new sandbox.
//
// The steps, each durable before the next: the "starting" record (so a
// crash from here on is rolled back by recovery), the VM bring-up
// (startVM), the "running" record. Any failure undoes everything.
func (o *Orchestrator) Create(ctx context.Context, opts CreateOptions) (rec Record, err error) {
	if opts.Timeout <= 0 {
		return rec, fmt.Errorf("create: timeout must be positive: %w", ErrInvalid)
	}
	if err := network.ValidatePolicy(opts.Policy); err != nil {
		return rec, fmt.Errorf("create: network policy: %w: %w", err, ErrInvalid)
	}
	done := o.m.observe("create")
	defer func() { done(err) }()
	s, t, err := o.register(opts)
	if err == nil {
		if err = o.checkMemory(t.MemoryMiB); err != nil {
			o.unregister(s)
		}
	}
	if err != nil {
		return rec, err
	}
	defer s.op.Unlock()
	id := s.rec.ID
	defer func() {
		if err != nil {
			o.abortCreate(ctx, s)
			err = fmt.Errorf("create sandbox %s: %w", id, err)
		}
	}()
	if err := os.MkdirAll(s.rec.Dir, 0o700); err != nil {
		return rec, err
	}
	if err := o.persist(s); err != nil {
		return rec, err
	}
	if err := fpCreateRecorded.Inject(); err != nil {
		return rec, err
	}
	if o.sd == nil {
		if err := sparseCopy(ctx, t.Rootfs, s.rec.Rootfs); err != nil {
			return rec, err
		}
	}
	if err := o.startVM(ctx, s, t.Snapshot, o.m.stage("create")); err != nil {
		return rec, err
	}
	now := time.Now().UTC()
	if err := o.update(s, func(r *Record) { r.StartedAt, r.EndAt, r.State = now, now.Add(opts.Timeout), Running }); err != nil {
		return rec, err
	}
	if err := fpCreateRunning.Inject(); err != nil {
		return rec, err
	}
	s.mu.Lock()
	o.armTimer(s)
	rec = s.rec
	s.mu.Unlock()
	o.log.Info("sandbox created", "sandbox", id, "template", t.ID)
	return rec, nil
}

// register resolves the create's source and enters the new sandbox, in
// state starting and with its operation lock held, into the registry, both
// under refMu: a deletion of the source either happened before (the create
// fails with not found) or sees the sandbox.
func (o *Orchestrator) register(opts CreateOptions) (*sandbox, *Template, error) {
	id, err := newID()
	if err != nil {
		return nil, nil, err
	}
	o.refMu.Lock()
	defer o.refMu.Unlock()
	t, err := o.source(opts.TemplateID)
	if err != nil {
		return nil, nil, err
	}
	dir := filepath.Join(o.cfg.DataDir, "sandboxes", id)
	s := &sandbox{rec: Record{
		ID: id, TemplateID: t.ID, State: Starting, Metadata: opts.Metadata, EnvVars: opts.EnvVars,
		AutoPause: opts.AutoPause, AutoResume: opts.AutoResume, Secure: opts.Secure,
		VCPUs: t.VCPUs, MemoryMiB: t.MemoryMiB, DiskMiB: t.DiskMiB, EnvdVersion: t.EnvdVersion,
		Dir: dir, Policy: opts.Policy, GuestToken: t.GuestToken,
	}}
	if o.sd != nil {
		s.rec.RootfsImage = t.RootfsImage
	} else {
		s.rec.Rootfs = filepath.Join(dir, "rootfs.ext4")
	}
	if opts.Secure {
		if s.rec.AccessToken, err = randomHex(32); err != nil {
			return nil, nil, err
		}
	}
	if opts.PrivateTraffic {
		if s.rec.TrafficToken, err = randomHex(32); err != nil {
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
	_, availKiB, err := meminfo()
	if err != nil || availKiB <= 0 {
		return nil // unknown: let the VMM try
	}
	if needKiB := int64(mib) << 10; availKiB < needKiB {
		return fmt.Errorf("create: %d MiB of guest memory asked, %d MiB available: %w", mib, availKiB>>10, ErrCapacity)
	}
	return nil
}

// unregister takes a sandbox that never started out of the registry.
func (o *Orchestrator) unregister(s *sandbox) {
	s.mu.Lock()
	s.gone = true
	s.mu.Unlock()
	o.mu.Lock()
	delete(o.sandboxes, s.rec.ID)
	o.mu.Unlock()
	s.op.Unlock()
}

// abortCreate undoes a failed create (op held): whatever startVM left is
// already released; the directory, the record and the registry entry go.
func (o *Orchestrator) abortCreate(ctx context.Context, s *sandbox) {
	o.stopVM(ctx, s)
	o.releaseDevice(ctx, s)
	s.mu.Lock()
	s.gone = true
	id, dir := s.rec.ID, s.rec.Dir
	s.mu.Unlock()
	o.mu.Lock()
	delete(o.sandboxes, id)
	o.mu.Unlock()
	if err := os.RemoveAll(dir); err != nil {
		o.log.Warn("remove directory of a failed create", "sandbox", id, "err", err)
	}
	if err := o.store.Delete(store.Sandboxes, id); err != nil {
		o.log.Warn("remove record of a failed create", "sandbox", id, "err", err)
	}
}

// startVM restores snapshotDir with the sandbox's rootfs and a fresh slot,
// waits for the agent and initialises it (op held). The stages run in
// order, each registering its undo; on failure the undo stack runs and
// nothing is left running. lap records the stages' latencies.
func (o *Orchestrator) startVM(ctx context.Context, s *sandbox, snapshotDir string, lap func(string)) (err error) {
	var undo cleanup
	defer func() {
		if err != nil {
			undo.run(context.WithoutCancel(ctx))
		}
	}()
	slot, err := o.nets.Acquire(ctx)
	if errors.Is(err, network.ErrExhausted) {
		return fmt.Errorf("network slot: %w: %w", err, ErrCapacity)
	}
	if err != nil {
		return fmt.Errorf("network slot: %w", err)
	}
	undo.add(func(ctx context.Context) { _ = o.nets.Release(ctx, slot) })
	if !isZeroPolicy(s.rec.Policy) {
		if err := slot.SetPolicy(ctx, s.rec.Policy); err != nil {
			return fmt.Errorf("network policy: %w", err)
		}
	}
	tap, err := slot.OpenTap()
	if err != nil {
		return fmt.Errorf("tap: %w", err)
	}
	defer tap.Close()
	lap("network")
	drive, err := o.rootfsDrive(ctx, s)
	if err != nil {
		return err
	}
	undo.add(func(ctx context.Context) { o.releaseDevice(ctx, s) })
	if err := fpCreateDisk.Inject(); err != nil {
		return err
	}
	lap("storage")
	mem, err := o.restoreMemory(ctx, snapshotDir)
	if err != nil {
		return err
	}
	lap("memory")
	// The generation names the run directory: recovery finds the VMM there.
	if err := o.update(s, func(r *Record) { r.Gen++ }); err != nil {
		return err
	}
	vm, err := o.drv.Restore(ctx, vmm.RestoreConfig{
		ID: fmt.Sprintf("%s-%d", s.rec.ID, s.rec.Gen), SnapshotDir: snapshotDir, MemoryFile: mem.File,
		RunDir: filepath.Join(s.rec.Dir, fmt.Sprintf("run-%d", s.rec.Gen)),
		Drives: []vmm.Drive{drive},
		NICs:   []vmm.NIC{{ID: nicID, MAC: slot.Guest().MAC.String(), Tap: tap}},
	})
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	undo.add(func(ctx context.Context) { _ = vm.Stop(ctx) })
	if err := o.pointAfterRestore(s).Inject(); err != nil {
		return err
	}
	lap("vmm_restore")
	pid := vm.Info().PID
	if err := o.update(s, func(r *Record) { r.PID, r.PIDStart = pid, procStart(pid) }); err != nil {
		return err
	}
	if err := fpCreateVMM.Inject(); err != nil {
		return err
	}
	if err := o.initGuest(ctx, s, vm, slot); err != nil {
		return err
	}
	lap("agent")
	o.log.Debug("vm started", "sandbox", s.rec.ID, "gen", s.rec.Gen, "slot", slot.Name, "pid", pid, "memory", mem.File)
	s.mu.Lock()
	s.vm, s.slot, s.rec.Memory, s.rec.Slot = vm, slot, mem, slot.Index
	s.rec.GuestToken = s.rec.AccessToken
	s.mu.Unlock()
	return nil
}

// pointAfterRestore is the fault point right after the VMM started: a
// create's or a resume's.
func (o *Orchestrator) pointAfterRestore(s *sandbox) interface{ Inject() error } {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rec.State == Resuming {
		return fpResumeRestored
	}
	return fpCreateRestored
}

// initGuest waits for the restored guest's agent and sends /init.
func (o *Orchestrator) initGuest(ctx context.Context, s *sandbox, vm vmm.Machine, slot *network.Slot) error {
	if err := waitAgent(ctx, slot, time.Minute); err != nil {
		console, _ := os.ReadFile(vm.Info().ConsoleLog)
		o.log.Error("restored guest's agent is silent", "sandbox", s.rec.ID, "console_tail", string(tail(console, 3000)))
		return fmt.Errorf("%w (guest console: %s)", err, strings.TrimSpace(string(tail(console, 600))))
	}
	req := initRequest{EnvVars: s.rec.EnvVars, DefaultUser: o.defaultUser(s.rec.TemplateID)}
	if s.rec.AccessToken != "" || s.rec.GuestToken != "" {
		req.AccessToken = &s.rec.AccessToken // "" clears a token the snapshot's sandbox had
	}
	return initAgent(ctx, slot, s.rec.GuestToken, req)
}

// stopVM stops the machine and releases the slot of s (any state).
func (o *Orchestrator) stopVM(ctx context.Context, s *sandbox) {
	s.mu.Lock()
	vm, slot := s.vm, s.slot
	s.vm, s.slot, s.rec.PID, s.rec.PIDStart, s.rec.Slot = nil, nil, 0, 0, 0
	id := s.rec.ID
	s.mu.Unlock()
	if vm != nil {
		if err := vm.Stop(context.WithoutCancel(ctx)); err != nil {
			o.log.Warn("stop vm", "sandbox", id, "err", err)
		}
	}
	if slot != nil {
		if err := o.nets.Release(context.WithoutCancel(ctx), slot); err != nil {
			o.log.Warn("release slot", "sandbox", id, "err", err)
		}
	}
}

// cleanup is an undo stack: every acquired resource registers how to give
// it back, and run gives them back once, newest first.
type cleanup struct {
	fns []func(context.Context)
}

func (c *cleanup) add(f func(context.Context)) { c.fns = append(c.fns, f) }

func (c *cleanup) run(ctx context.Context) {
	for i := len(c.fns) - 1; i >= 0; i-- {
		c.fns[i](ctx)
	}
	c.fns = nil
}
