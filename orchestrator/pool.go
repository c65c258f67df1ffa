package orchestrator

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/agentenv/agentenv/internal/vmmproc"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/template"
	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/warmpool"
	"github.com/prometheus/client_golang/prometheus"
)

// The warm pool of VMM processes (package warmpool): per pooled
// template, VMMs started ahead by the VM bring-up's first half
// (sandbox.Spec.Prepare), each holding a network slot, a root disk from the
// storage daemon and the template's memory file. A create from the template
// that brings no drives takes one:
//
//  1. the sandbox's "starting" record names the entry's VMM (pid, start
//     time) and device, with the generation its VM runs as
//     (orchestrator/pool/claimed);
//  2. the storage daemon assigns the device to the sandbox
//     (orchestrator/pool/assigned);
//  3. the entry's record goes (warmpool/handed);
//  4. the bring-up's second half (sandbox.Spec.Pooled) moves the VMM's run
//     directory to the sandbox's, loads the template's state and continues
//     as any create (create/restored, vmm-recorded, running).
//
// A crash anywhere in 1-4 leaves a "starting" sandbox, rolled back by
// recovery with what its record names, and at most an entry record, removed
// with what it names (warmpool.Recover); both removals tolerate the other.

// poolDir holds the entries' directories.
func (o *Orchestrator) poolDir() string { return filepath.Join(o.cfg.DataDir, "pool") }

// newPool returns the node's warm pool (nil when it is off or cannot run
// here: it needs the storage daemon, whose devices a create can take over,
// and a driver that starts VMMs ahead).
func (o *Orchestrator) newPool() *warmpool.Pool {
	c := o.cfg.VMMPool
	if c.High <= 0 {
		return nil
	}
	if _, ok := o.drv.(vmm.Preparer); !ok {
		o.log.Warn("the warm pool of VMM processes stays off: it needs a driver that starts VMMs ahead", "driver", o.drv.Name())
		return nil
	}
	return warmpool.New(warmpool.Options{Store: o.store, Filler: poolFiller{o}, Dir: o.poolDir(),
		Low: c.Low, High: c.High, ReserveMiB: c.ReserveMiB, Logger: o.log})
}

// poolTemplate keeps a committed template's pool filled when the
// configuration names it (by id or name).
func (o *Orchestrator) poolTemplate(t *template.Template) {
	if o.pool == nil || t.RootfsImage == "" {
		return
	}
	for _, want := range o.cfg.VMMPool.Templates {
		if want == t.ID || slices.Contains(t.Names, want) {
			o.pool.Want(t.ID, t.MemoryMiB)
			return
		}
	}
}

// unpoolTemplate drains a template's entries before its files go.
func (o *Orchestrator) unpoolTemplate(ctx context.Context, id string) {
	if o.pool != nil {
		o.pool.Drop(ctx, id)
	}
}

// PoolStats reports the warm pool's size (ok false when it is off).
func (o *Orchestrator) PoolStats() (st warmpool.Stats, ok bool) {
	if o.pool == nil {
		return st, false
	}
	return o.pool.Stats(), true
}

// registerPoolMetrics exports the pool's size and takes.
func (o *Orchestrator) registerPoolMetrics(reg prometheus.Registerer) {
	if reg == nil {
		return
	}
	gauge := func(state string, f func(warmpool.Stats) int) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "aenvd_vmm_pool_entries", Help: "Entries of the warm pool of VMM processes.",
			ConstLabels: prometheus.Labels{"state": state}}, func() float64 { return float64(f(o.pool.Stats())) })
	}
	takes := func(result string, f func(warmpool.Stats) int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "aenvd_vmm_pool_takes_total", Help: "Starts (creates, resumes, fork children) on a pooled template by whether an entry was ready.",
			ConstLabels: prometheus.Labels{"result": result}}, func() float64 { return float64(f(o.pool.Stats())) })
	}
	reg.MustRegister(
		gauge(warmpool.Ready, func(s warmpool.Stats) int { return s.Ready }),
		gauge(warmpool.Starting, func(s warmpool.Stats) int { return s.Starting }),
		takes("hit", func(s warmpool.Stats) int64 { return s.Hits }),
		takes("miss", func(s warmpool.Stats) int64 { return s.Misses }))
}

// startPooled restores vmDir on the VM of pool entry e (startCreate,
// startResume). A pooled start that fails (say its VMM died while it
// waited) has released the entry; the start goes on with a restore of its
// own.
func (o *Orchestrator) startPooled(ctx context.Context, s *instance, vmDir string, lap func(string), e *warmpool.Entry) error {
	err := o.startVMFrom(ctx, s, vmDir, lap, e)
	o.pool.Done(e)
	_ = os.RemoveAll(e.Dir) // its run directory moved to the sandbox's, or went with the VM
	if err == nil || ctx.Err() != nil {
		return err
	}
	o.log.Warn("start on a pooled VM failed; restoring a VM of its own", "sandbox", s.rec.ID, "entry", e.ID, "err", err)
	return o.startVM(ctx, s, vmDir, lap)
}

// takeEntry takes a ready entry for the sandbox s created from t (nil when
// none fits): one of t's own when t is a pooled template; for a snapshot
// seen as a template (a fork's child), one of the template its memory
// stacks on, its disk moved onto the snapshot's (takeRebased).
func (o *Orchestrator) takeEntry(ctx context.Context, s *instance, t *template.Template) *warmpool.Entry {
	s.mu.Lock()
	plain := len(s.rec.Drives) == 0 && !s.rec.ColdBoot
	s.mu.Unlock()
	if o.pool == nil || !plain {
		return nil
	}
	if reg, ok := o.catalog.ByID(t.ID); !ok || reg.Snapshot != t.Snapshot {
		return o.takeRebased(ctx, s, t.Snapshot)
	}
	return o.pool.Take(t.ID)
}

// claimEntry makes the sandbox's record name what the entry holds: its
// VMM and device (the slot is recorded with "running", as any create's),
// and that the VMM has not loaded the sandbox's state yet (PoolClaim,
// cleared once it has).
func claimEntry(r *sandbox.Record, e *warmpool.Entry) {
	r.PoolClaim = e != nil
	if e != nil {
		r.PID, r.PIDStart = e.PID, e.PIDStart
		r.Device, r.HasDevice = e.Device, e.HasDevice
	}
}

// takeOver finishes a claim recorded in the sandbox's record: the device
// becomes the sandbox's and the entry's record goes.
func (o *Orchestrator) takeOver(ctx context.Context, s *instance, e *warmpool.Entry) error {
	if e == nil {
		return nil
	}
	if err := fpPoolClaimed.Inject(); err != nil {
		return err
	}
	if e.HasDevice {
		if err := o.disks.Assign(ctx, e.Device, s.rec.ID); err != nil {
			return fmt.Errorf("take over the device of pool entry %s: %w", e.ID, err)
		}
	}
	if err := fpPoolAssigned.Inject(); err != nil {
		return err
	}
	o.log.Info("sandbox takes a pooled VM", "sandbox", s.rec.ID, "entry", e.ID, "pid", e.PID, "slot", e.Slot)
	return o.pool.Handed(e)
}

// dropEntry drains an entry a claim could not finish with and clears what
// the sandbox's record named of it.
func (o *Orchestrator) dropEntry(ctx context.Context, s *instance, e *warmpool.Entry) {
	if e == nil {
		return
	}
	o.pool.Discard(ctx, e)
	s.mu.Lock()
	s.rec.PID, s.rec.PIDStart = 0, 0
	s.rec.Device, s.rec.HasDevice = 0, false
	s.mu.Unlock()
}

// poolFiller makes the pool's entries with the VM bring-up's first half.
type poolFiller struct{ o *Orchestrator }

// Fill starts a VMM of template rec.Key waiting for its state, with a slot
// and a fresh root disk on the template's layers (owned by the entry).
func (f poolFiller) Fill(ctx context.Context, rec *warmpool.Record, started func() error) (*sandbox.VM, error) {
	o := f.o
	t, ok := o.catalog.ByID(rec.Key)
	if !ok {
		return nil, fmt.Errorf("template %s: %w", rec.Key, ErrNotFound)
	}
	if err := os.MkdirAll(rec.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("pool entry %s: %w", rec.ID, err)
	}
	disk := o.disks.Owned(rec.ID, rec.Dir, t.RootfsImage)
	vm, err := sandbox.Start(ctx, o.vms, sandbox.Spec{
		ID: rec.ID, RunDir: filepath.Join(rec.Dir, "run"), Disk: disk, Drives: make([]sandbox.Disk, t.DriveSlots),
		Restore: t.Snapshot, Prepare: true, VCPUs: t.VCPUs, MemoryMiB: t.MemoryMiB, Log: o.log,
		Memory: func(ctx context.Context) (sandbox.Memory, error) {
			_, vm, err := o.mem.VMMemory(ctx, t.Snapshot, rec.ID)
			return vm, err
		},
		Started: func(m vmm.Machine) error {
			pid := m.Info().PID
			rec.PID, rec.PIDStart = pid, vmmproc.Start(pid)
			rec.Device, rec.HasDevice = disk.Device()
			return started()
		},
	})
	if err != nil {
		_ = os.RemoveAll(rec.Dir)
		return nil, err
	}
	rec.Slot = vm.Slot.Index
	return vm, nil
}

// Drain stops an entry's VMM and releases its slot, disk and directory.
func (f poolFiller) Drain(ctx context.Context, e *warmpool.Entry) {
	if err := e.VM.Close(ctx); err != nil {
		f.o.log.Warn("drain pool entry", "entry", e.ID, "err", err)
	}
	_ = os.RemoveAll(e.Dir)
}
