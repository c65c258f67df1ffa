package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/agentenv/agentenv/storage/daemon/client"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/store"
	"github.com/agentenv/agentenv/vmm"
)

// Recovered is what Recover took over: running VMs a previous aenvd left
// (after kill -9 or a crash), to be re-adopted by New with their network
// slots, which the network manager must keep through its startup cleanup.
type Recovered struct {
	machines map[string]vmm.Machine // by sandbox id
	slots    []int
}

func (r *Recovered) machine(id string) (vmm.Machine, bool) {
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

// Recover runs before the network manager starts (which clears the previous
// run's slots but those it is told to keep). It takes over every VMM process
// a previous aenvd left running: one whose network slot is known stays
// running (New re-adopts it with its slot); others (older records, or a
// sandbox caught mid-pause or mid-resume) are snapshotted and stopped, so
// the sandbox is kept as paused and resumes on the next connect. Sandboxes
// whose VMM cannot be adopted are stopped and dropped. Paused sandboxes are
// left alone.
//
// sd is the storage daemon (nil in file mode): a paused sandbox's rootfs
// upper is sealed like on pause; a dropped one's device is deleted.
func Recover(ctx context.Context, drv vmm.Driver, st *store.Store, sd *client.Client, log *slog.Logger) (*Recovered, error) {
	if log == nil {
		log = slog.Default()
	}
	recs, err := store.ListAll[Record](st, store.Sandboxes)
	if err != nil {
		return nil, fmt.Errorf("recover sandboxes: %w", err)
	}
	out := &Recovered{machines: map[string]vmm.Machine{}}
	for _, r := range recs {
		if r.State == Paused {
			continue
		}
		if r.State == Running || r.State == Pausing || r.State == Resuming {
			m, err := adoptVM(ctx, drv, r)
			if err == nil && r.State == Running && r.Slot > 0 {
				out.machines[r.ID], out.slots = m, append(out.slots, r.Slot)
				log.Info("re-adopted running sandbox's VM", "sandbox", r.ID, "pid", m.Info().PID, "slot", r.Slot)
				continue
			}
			if err == nil {
				err = pauseAdopted(ctx, st, sd, r, m, log)
			}
			if err == nil {
				continue
			}
			log.Warn("cannot re-adopt sandbox; dropping it", "sandbox", r.ID, "state", r.State, "err", err)
		}
		if err := dropRecord(ctx, st, sd, r); err != nil {
			return nil, err
		}
	}
	if sd != nil {
		return out, reclaimDevices(ctx, st, sd, log)
	}
	return out, nil
}

// dropRecord stops whatever is left of a sandbox and forgets it.
func dropRecord(ctx context.Context, st *store.Store, sd *client.Client, r Record) error {
	killStale(r.PID, r.ID)
	if sd != nil && r.HasDevice {
		_ = sd.Delete(ctx, r.Device)
	}
	_ = os.RemoveAll(r.Dir)
	return st.Delete(store.Sandboxes, r.ID)
}

// reclaimDevices deletes the daemon's devices no sandbox record holds (a
// crash between creating a device and recording it, or mid template build).
func reclaimDevices(ctx context.Context, st *store.Store, sd *client.Client, log *slog.Logger) error {
	recs, err := store.ListAll[Record](st, store.Sandboxes)
	if err != nil {
		return fmt.Errorf("reclaim devices: %w", err)
	}
	held := map[uint32]string{}
	for _, r := range recs {
		if r.HasDevice {
			held[r.Device] = r.ID
		}
	}
	devs, err := sd.List(ctx)
	if err != nil {
		return fmt.Errorf("reclaim devices: %w", err)
	}
	for _, d := range devs {
		if owner, ok := held[d.ID]; d.Kind != rpc.KindRuntime || ok && owner == d.Owner {
			continue
		}
		if err := sd.Delete(ctx, d.ID); err != nil {
			log.Warn("reclaim storage device", "device", d.ID, "owner", d.Owner, "err", err)
			continue
		}
		log.Info("reclaimed orphaned storage device", "device", d.ID, "owner", d.Owner)
	}
	return nil
}

// adoptVM takes over the sandbox's running VMM from its run directory.
func adoptVM(ctx context.Context, drv vmm.Driver, r Record) (vmm.Machine, error) {
	ad, ok := drv.(vmm.Adopter)
	if !ok {
		return nil, fmt.Errorf("driver %s cannot adopt machines: %w", drv.Name(), vmm.ErrUnsupported)
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return ad.Adopt(ctx, filepath.Join(r.Dir, fmt.Sprintf("run-%d", r.Gen)))
}

// pauseAdopted pauses and snapshots an adopted VM, stops it and records the
// sandbox as paused. The VM is stopped whatever happens.
func pauseAdopted(ctx context.Context, st *store.Store, sd *client.Client, r Record, m vmm.Machine, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	defer m.Stop(context.WithoutCancel(ctx))
	if err := m.Pause(ctx); err != nil {
		return fmt.Errorf("pause adopted machine: %w", err)
	}
	snapDir := filepath.Join(r.Dir, fmt.Sprintf("snapshot-%d", r.Gen))
	if snapDir == r.Snapshot {
		return errors.New("snapshot directory of this generation already in use")
	}
	_ = os.RemoveAll(snapDir) // a pause the crash interrupted
	diff := filepath.Join(r.Dir, fmt.Sprintf("mem-%d.lsmt", r.Gen))
	if err := captureVM(ctx, log, r.ID, m, r.Memory, snapDir, diff); err != nil {
		_ = os.RemoveAll(snapDir)
		return fmt.Errorf("snapshot adopted machine: %w", err)
	}
	if err := m.Stop(ctx); err != nil {
		return fmt.Errorf("stop adopted machine: %w", err)
	}
	if sd != nil {
		if err := sealDevice(ctx, sd, &r); err != nil {
			_ = os.RemoveAll(snapDir)
			return err
		}
	}
	if r.Snapshot != "" {
		_ = os.RemoveAll(r.Snapshot)
	}
	r.State, r.Snapshot, r.PID, r.Slot = Paused, snapDir, 0, 0
	if err := st.Put(store.Sandboxes, r.ID, r); err != nil {
		return err
	}
	log.Info("re-adopted sandbox after restart and kept it paused", "sandbox", r.ID)
	return nil
}

// adoptRunning makes a recovered VM a running sandbox again: its slot is
// adopted from the network manager, the sandbox's egress policy set anew,
// its agent checked and its timeout re-armed. If any of that fails, the
// sandbox is paused (snapshot, then the VM stops) or, failing that, dropped.
func (o *Orchestrator) adoptRunning(ctx context.Context, r Record, m vmm.Machine) {
	s := &sandbox{rec: r, vm: m}
	err := func() error {
		slot, err := o.nets.Adopt(ctx, r.Slot)
		if err != nil {
			return err
		}
		s.slot = slot
		if !isZeroPolicy(r.Policy) {
			if err := slot.SetPolicy(ctx, r.Policy); err != nil {
				return fmt.Errorf("network policy: %w", err)
			}
		}
		return waitAgent(ctx, slot, 20*time.Second)
	}()
	if err == nil {
		s.rec.PID = m.Info().PID
		err = o.store.Put(store.Sandboxes, r.ID, s.rec)
	}
	if err != nil {
		o.log.Warn("re-adopted VM cannot run on; pausing the sandbox", "sandbox", r.ID, "err", err)
		// The slot goes back only once the VM using its tap is stopped
		// (pauseAdopted stops it whatever happens).
		perr := pauseAdopted(ctx, o.store, o.sd, r, m, o.log)
		if s.slot != nil {
			_ = o.nets.Release(context.WithoutCancel(ctx), s.slot)
		} else {
			_ = o.nets.Forget(r.Slot)
		}
		if err := perr; err != nil {
			o.log.Warn("cannot keep the re-adopted sandbox; dropping it", "sandbox", r.ID, "err", err)
			if err := dropRecord(ctx, o.store, o.sd, r); err != nil {
				o.log.Error("drop sandbox", "sandbox", r.ID, "err", err)
			}
			return
		}
		var rec Record
		if err := o.store.Get(store.Sandboxes, r.ID, &rec); err == nil {
			o.sandboxes[r.ID] = &sandbox{rec: rec}
		}
		return
	}
	o.sandboxes[r.ID] = s
	s.mu.Lock()
	o.armTimer(s)
	s.mu.Unlock()
	o.log.Info("sandbox keeps running after the restart", "sandbox", r.ID, "slot", s.slot.Name)
}
