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

// Recover runs before the network manager starts (which clears the previous
// run's slots): it takes over every VMM process a previous aenvd left running
// (after kill -9 or a crash), snapshots it and stops it, so the sandbox is
// kept as paused and resumes on the next connect. Sandboxes whose VMM cannot
// be adopted are stopped and dropped. Paused sandboxes are left alone.
//
// sd is the storage daemon (nil in file mode): a recovered sandbox's rootfs
// upper is sealed like on pause; a dropped one's device is deleted.
func Recover(ctx context.Context, drv vmm.Driver, st *store.Store, sd *client.Client, log *slog.Logger) error {
	if log == nil {
		log = slog.Default()
	}
	recs, err := store.ListAll[Record](st, store.Sandboxes)
	if err != nil {
		return fmt.Errorf("recover sandboxes: %w", err)
	}
	for _, r := range recs {
		if r.State == Paused {
			continue
		}
		if r.State == Running || r.State == Pausing || r.State == Resuming {
			if err := recoverOne(ctx, drv, st, sd, r, log); err == nil {
				continue
			} else {
				log.Warn("cannot re-adopt sandbox; dropping it", "sandbox", r.ID, "state", r.State, "err", err)
			}
		}
		killStale(r.PID, r.ID)
		if sd != nil && r.HasDevice {
			_ = sd.Delete(ctx, r.Device)
		}
		_ = os.RemoveAll(r.Dir)
		if err := st.Delete(store.Sandboxes, r.ID); err != nil {
			return err
		}
	}
	if sd != nil {
		return reclaimDevices(ctx, st, sd, log)
	}
	return nil
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

// recoverOne adopts the sandbox's VMM, pauses and snapshots it, stops it and
// records the sandbox as paused.
func recoverOne(ctx context.Context, drv vmm.Driver, st *store.Store, sd *client.Client, r Record, log *slog.Logger) error {
	ad, ok := drv.(vmm.Adopter)
	if !ok {
		return fmt.Errorf("driver %s cannot adopt machines: %w", drv.Name(), vmm.ErrUnsupported)
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	m, err := ad.Adopt(ctx, filepath.Join(r.Dir, fmt.Sprintf("run-%d", r.Gen)))
	if err != nil {
		return err
	}
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
	r.State, r.Snapshot, r.PID = Paused, snapDir, 0
	if err := st.Put(store.Sandboxes, r.ID, r); err != nil {
		return err
	}
	log.Info("re-adopted sandbox after restart and kept it paused", "sandbox", r.ID)
	return nil
}
