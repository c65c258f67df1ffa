// Package recovery settles a node's sandboxes at startup, before the
// network manager and the orchestrator start: every transition a crash
// interrupted is finished or rolled back (Recover), running VMs whose
// VMM survived are handed to the orchestrator to re-adopt (Recovered),
// and VMM processes and storage devices no record owns are removed. It
// writes records only through a recovery sandbox.Journal, which fires no
// fault points and publishes no events.
package recovery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/agentenv/agentenv/disk"
	"github.com/agentenv/agentenv/internal/vmmproc"
	"github.com/agentenv/agentenv/lifecycle"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/store"
	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/warmpool"
)

// Recovered is what Recover took over: running VMs a previous aenvd left
// (after kill -9 or a crash), to be re-adopted by New with their network
// slots, which the network manager must keep through its startup cleanup.
type Recovered struct {
	machines map[string]vmm.Machine // by sandbox id
	slots    []int
}

// Machine is the recovered VM of sandbox id, if Recover took one over.
func (r *Recovered) Machine(id string) (vmm.Machine, bool) {
	if r == nil {
		return nil, false
	}
	m, ok := r.machines[id]
	return m, ok
}

// Slots are the network slot indexes of the recovered VMs (network.Config.Keep).
func (r *Recovered) Slots() []int {
	if r == nil {
		return nil
	}
	return r.slots
}

// recovery carries what the startup steps share.
type recovery struct {
	drv     vmm.Driver
	st      *store.Store
	j       *sandbox.Journal // recovery publishes no events: nothing subscribed yet
	sd      *disk.Manager
	verbs   *lifecycle.Verbs // the pause and kill of serving sandboxes
	log     *slog.Logger
	dataDir string
}

// Recover runs before the network manager starts (which clears the previous
// run's slots but those it is told to keep). It walks every sandbox record
// and finishes or rolls back the transition a crash interrupted:
//
//   - running with its VMM alive and its slot known: taken over (New
//     re-adopts it with its slot);
//   - running, pausing or resuming with its VMM alive otherwise: paused
//     (memory captured from the live VM, disk sealed), so nothing is lost;
//   - running or pausing whose VMM is gone: paused filesystem-only (its
//     memory is lost with the VMM, its disks are kept);
//   - resuming whose VMM never came up: back to paused on its snapshot;
//   - starting (a create that never answered): rolled back;
//   - killing: the kill is finished;
//   - paused: a VMM or device a pause left behind is removed.
//
// Then every VMM process under the data directory that no record owns is
// killed, and every storage device no record holds is deleted.
// Sandboxes whose VMM is gone while running or pausing keep their disks:
// they are paused filesystem-only (lifecycle.Verbs.PauseExited), their
// record saying why; those without a disk are dropped.
func Recover(ctx context.Context, drv vmm.Driver, st *store.Store, devices disk.Devices, dataDir string, log *slog.Logger) (*Recovered, error) {
	if log == nil {
		log = slog.Default()
	}
	sd, err := disk.Open(devices, log)
	if err != nil {
		return nil, fmt.Errorf("recover sandboxes: %w", err)
	}
	rc := &recovery{drv: drv, st: st, j: &sandbox.Journal{Store: st, Log: log, Recovery: true}, sd: sd, log: log, dataDir: dataDir,
		verbs: &lifecycle.Verbs{Disks: sd, Store: st, Log: log, DataDir: dataDir}}
	// Nothing of the warm pool is kept: its entries go before the sandboxes
	// that may have claimed one are settled (either removal tolerates the
	// other's).
	if err := warmpool.Recover(ctx, st, filepath.Join(dataDir, "pool"), removeEntry(sd), log); err != nil {
		return nil, err
	}
	recs, err := store.ListAll[sandbox.Record](st, store.Sandboxes)
	if err != nil {
		return nil, fmt.Errorf("recover sandboxes: %w", err)
	}
	out := &Recovered{machines: map[string]vmm.Machine{}}
	for _, r := range recs {
		if err := rc.recoverOne(ctx, r, out); err != nil {
			return nil, err
		}
	}
	owned := map[int]bool{}
	for _, m := range out.machines {
		owned[m.Info().PID] = true
	}
	vmmproc.ReapOrphans(dataDir, owned, log)
	return out, reclaimDevices(ctx, st, sd)
}

func (rc *recovery) recoverOne(ctx context.Context, r sandbox.Record, out *Recovered) error {
	switch r.State {
	case sandbox.Paused:
		return rc.tidyPaused(ctx, r)
	case sandbox.Starting:
		rc.log.Warn("rolling back a create interrupted by a restart", "sandbox", r.ID)
		return DropRecord(ctx, rc.verbs, rc.j, r, nil)
	case sandbox.Killing:
		rc.log.Info("finishing a kill interrupted by a restart", "sandbox", r.ID)
		return DropRecord(ctx, rc.verbs, rc.j, r, nil)
	}
	if r.State == sandbox.Resuming && r.PoolClaim {
		// Its VMM came from the warm pool and may never have loaded the
		// sandbox's state: pausing it would record a VM that never ran
		// the sandbox. tidyPaused stops it and deletes the device.
		rc.log.Warn("a resume on a pooled VM interrupted by a restart goes back to paused", "sandbox", r.ID, "pid", r.PID)
		if err := rc.j.Transition(r, sandbox.Paused, func(r *sandbox.Record) { r.PoolClaim = false }, func(n sandbox.Record) { r = n }); err != nil {
			return err
		}
		return rc.tidyPaused(ctx, r)
	}
	m, err := adoptVM(ctx, rc.drv, r)
	if err == nil && r.State == sandbox.Running && r.Slot > 0 {
		out.machines[r.ID], out.slots = m, append(out.slots, r.Slot)
		rc.log.Info("re-adopted running sandbox's VM", "sandbox", r.ID, "pid", m.Info().PID, "slot", r.Slot)
		return nil
	}
	if err == nil {
		if err = PauseAdopted(ctx, rc.verbs, rc.j, r, m); err == nil {
			return nil
		}
	}
	if r.State == sandbox.Resuming && (r.Snapshot != "" || r.FilesystemOnly) {
		rc.log.Warn("a resume interrupted by a restart goes back to paused", "sandbox", r.ID, "err", err)
		if m != nil {
			_ = m.Stop(ctx)
		}
		if err := rc.j.Transition(r, sandbox.Paused, nil, func(n sandbox.Record) { r = n }); err != nil {
			return err
		}
		return rc.tidyPaused(ctx, r)
	}
	if m == nil && (r.State == sandbox.Running || r.State == sandbox.Pausing) && r.HasDevice {
		// The VMM is gone (or cannot be taken over): its memory is lost,
		// its disks are not.
		why := fmt.Sprintf("the VMM was gone when the node started (%v)", err)
		s := lifecycle.Adopted(r, nil, rc.j, rc.verbs.Disks, rc.log)
		perr := rc.verbs.PauseExited(ctx, s, why)
		if perr == nil {
			return nil
		}
		err = errors.Join(err, perr)
	}
	rc.log.Error("cannot re-adopt sandbox; dropping it", "sandbox", r.ID, "state", r.State, "err", err)
	return DropRecord(ctx, rc.verbs, rc.j, r, nil)
}

// tidyPaused removes what a pause interrupted after its "paused" record
// left: the VMM process and the storage device.
func (rc *recovery) tidyPaused(ctx context.Context, r sandbox.Record) error {
	if r.PID == 0 && len(r.Devices()) == 0 && r.Slot == 0 {
		return nil
	}
	vmmproc.Kill(r.PID, r.PIDStart)
	if err := rc.sd.DeleteRecordDevices(ctx, r); err != nil {
		rc.log.Warn("delete the devices of a paused sandbox", "sandbox", r.ID, "err", err)
	}
	r.PID, r.PIDStart, r.Slot = 0, 0, 0
	r.ClearDevices()
	rc.log.Info("finished a pause interrupted by a restart", "sandbox", r.ID)
	return rc.j.Put(r)
}

// DropRecord kills what is left of a sandbox a restart found (its VMM,
// devices, directory and record) with the kill of a serving sandbox
// (lifecycle.Verbs.Kill); m is its adopted VMM, nil when none was.
func DropRecord(ctx context.Context, v *lifecycle.Verbs, j *sandbox.Journal, r sandbox.Record, m vmm.Machine) error {
	return v.Kill(ctx, lifecycle.Adopted(r, m, j, v.Disks, v.Log), lifecycle.Removal{})
}

// reclaimDevices deletes the daemon's devices no sandbox record holds (a
// crash between creating a device and recording it, or mid template build).
func reclaimDevices(ctx context.Context, st *store.Store, sd *disk.Manager) error {
	recs, err := store.ListAll[sandbox.Record](st, store.Sandboxes)
	if err != nil {
		return fmt.Errorf("reclaim devices: %w", err)
	}
	held := map[uint32]string{}
	for _, r := range recs {
		for _, id := range r.Devices() {
			held[id] = r.ID
		}
	}
	return sd.Reclaim(ctx, held)
}

// adoptVM takes over the sandbox's running VMM from its run directory.
func adoptVM(ctx context.Context, drv vmm.Driver, r sandbox.Record) (vmm.Machine, error) {
	ad, ok := drv.(vmm.Adopter)
	if !ok {
		return nil, fmt.Errorf("driver %s cannot adopt machines: %w", drv.Name(), vmm.ErrUnsupported)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return ad.Adopt(ctx, filepath.Join(r.Dir, fmt.Sprintf("run-%d", r.Gen)))
}

// PauseAdopted pauses an adopted VM with the pause of a serving sandbox
// (lifecycle.Verbs.Pause): vCPUs stopped, memory and VM state written and
// synced, disks sealed (a seal the crash interrupted is finished, not
// repeated), "paused" recorded, then the VMM stopped and the devices
// deleted. The VM is stopped whatever happens. A filesystem-only pause
// the crash interrupted is finished as one (no memory; the guest flushed
// before "pausing" was recorded); any other live VM is paused with its
// memory, so nothing is lost.
func PauseAdopted(ctx context.Context, v *lifecycle.Verbs, j *sandbox.Journal, r sandbox.Record, m vmm.Machine) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	s := lifecycle.Adopted(r, m, j, v.Disks, v.Log)
	defer s.StopVM(context.WithoutCancel(ctx))
	if _, err := v.Pause(ctx, s, r.State == sandbox.Pausing && r.FilesystemOnly); err != nil {
		return err
	}
	v.Log.Info("re-adopted sandbox after restart and kept it paused", "sandbox", r.ID)
	return nil
}

// removeEntry removes what a previous process's pool entry r names
// (recovery): its VMM, if that process still runs, its device and its
// directory. Its slot is cleared by the network's start, which keeps only
// running sandboxes' slots.
func removeEntry(disks *disk.Manager) func(context.Context, warmpool.Record) {
	return func(ctx context.Context, r warmpool.Record) {
		vmmproc.Kill(r.PID, r.PIDStart)
		if r.HasDevice {
			disks.Detach(ctx, "pool entry "+r.ID, r.Device)
		}
		_ = os.RemoveAll(r.Dir)
	}
}
