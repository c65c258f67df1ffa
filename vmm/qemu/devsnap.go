package qemu

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/vmm"
)

var _ vmm.DeviceSnapshotter = (*machine)(nil)

// SnapshotDevices implements vmm.DeviceSnapshotter.
//
// A restored machine maps its memory image privately, so a migration
// (even with x-ignore-shared) would walk and stream its whole RAM. QEMU's
// xen-save-devices-state writes the device sections alone, touching no
// RAM, and leaves the machine paused: the cost no longer grows with the
// guest's memory. The state loads like any other (an incoming migration
// with no RAM section) over the memory image the caller captured, mapped
// privately. What it leaves out besides guest RAM is the firmware's RAM
// blocks (the boot firmware, the tables it placed below 1 MiB, fw_cfg
// blobs): a Linux guest reads them only while it boots, and a reboot ends
// the VMM (-no-reboot), so a restored guest never sees them empty.
func (m *machine) SnapshotDevices(ctx context.Context, dir string) (*vmm.Snapshot, error) {
	start := time.Now()
	if err := m.requirePausedOnce(ctx); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("snapshot devices %s: %w", m.id, err)
	}
	snap := &vmm.Snapshot{Dir: dir, StateFile: filepath.Join(dir, vmm.SnapshotStateFile)}
	size, err := m.saveDeviceState(ctx, snap.StateFile)
	if err != nil {
		return nil, fmt.Errorf("snapshot devices %s: %w", m.id, err)
	}
	// A memory file already in dir (say, the image this VM was restored
	// from) stays: it may be in use. config.json's noMemory keeps Restore
	// from taking it for this snapshot's memory.
	// A device-only stream has no configuration section, which version 2
	// machines expect; the device set (the balloon of version 3) stays the
	// machine's.
	spec := *m.spec
	spec.Version, spec.NoMemory = max(spec.Version, 2), true
	b, _ := json.MarshalIndent(&spec, "", "  ")
	if err := atomicfile.WriteFile(filepath.Join(dir, vmm.SnapshotConfigFile), b, 0o600); err != nil {
		return nil, fmt.Errorf("snapshot devices %s: %w", m.id, err)
	}
	snap.StateBytes = size
	snap.MemBytes = int64(m.spec.MemoryMiB) << 20
	snap.Took = time.Since(start)
	m.log.Info("device snapshot written", "dir", dir, "state_bytes", snap.StateBytes, "took", snap.Took.Round(time.Millisecond))
	return snap, nil
}

// saveDeviceState writes the device state into path atomically (so a
// failure never leaves a partial state) through a descriptor handed to QEMU
// in a descriptor set (QEMU opens nothing).
func (m *machine) saveDeviceState(ctx context.Context, path string) (int64, error) {
	af, err := atomicfile.Create(path, 0o600)
	if err != nil {
		return 0, fmt.Errorf("state file: %w", err)
	}
	defer af.Abort()
	// QEMU takes a descriptor of a set only with the access mode it opens
	// with, write-only here; the temporary file is open read-write.
	w, err := os.OpenFile(af.Name(), os.O_WRONLY, 0)
	if err != nil {
		return 0, fmt.Errorf("state file: %w", err)
	}
	defer w.Close()
	fdset, err := m.addFdset(ctx, w)
	if err != nil {
		return 0, fmt.Errorf("pass state file: %w", err)
	}
	defer m.removeFdset(ctx, fdset)
	// live=false: live would also give up the disks, as for a migration.
	args := map[string]any{"filename": fdsetPath(fdset), "live": false}
	if err := m.qmp.Execute(ctx, "xen-save-devices-state", args, nil); err != nil {
		return 0, fmt.Errorf("save device state: %w", err)
	}
	fi, err := af.Stat()
	if err != nil {
		return 0, fmt.Errorf("state file: %w", err)
	}
	if fi.Size() == 0 || fi.Size() > maxDeviceState {
		return 0, fmt.Errorf("device state of %d bytes (want 1 to %d): not a device state", fi.Size(), maxDeviceState)
	}
	if err := af.Commit(); err != nil {
		return 0, fmt.Errorf("state file: %w", err)
	}
	return fi.Size(), nil
}

// addFdset hands f to QEMU as a new descriptor set, which commands taking
// a file name open as /dev/fdset/<id> (with f's access mode).
func (m *machine) addFdset(ctx context.Context, f *os.File) (int, error) {
	var out struct {
		ID int `json:"fdset-id"`
	}
	if err := m.qmp.ExecuteWithFile(ctx, "add-fd", map[string]any{}, f, &out); err != nil {
		return 0, err
	}
	return out.ID, nil
}

// removeFdset closes QEMU's copy of a descriptor set's file.
func (m *machine) removeFdset(ctx context.Context, id int) {
	if err := m.qmp.Execute(context.WithoutCancel(ctx), "remove-fd", map[string]any{"fdset-id": id}, nil); err != nil {
		m.log.Warn("remove descriptor set", "fdset", id, "err", err)
	}
}

func fdsetPath(id int) string { return fmt.Sprintf("/dev/fdset/%d", id) }

// requirePausedOnce fails unless the VM is paused and took no snapshot
// during this pause. Unlike a full snapshot it must not run the guest to
// leave the postmigrate state: the caller may have captured guest memory
// already, and the state must match it.
func (m *machine) requirePausedOnce(ctx context.Context) error {
	if err := m.alive(); err != nil {
		return err
	}
	st, err := m.status(ctx)
	if err != nil {
		return fmt.Errorf("snapshot devices %s: %w", m.id, err)
	}
	switch st {
	case "paused":
		return nil
	case "postmigrate":
		return fmt.Errorf("snapshot devices %s: the vm already took (or failed) a snapshot during this pause; resume and pause it, or take a full Snapshot: %w", m.id, vmm.ErrUnsupported)
	default:
		return fmt.Errorf("snapshot devices %s: vm is %s: %w", m.id, st, vmm.ErrNotPaused)
	}
}

// requirePaused fails unless the VM is paused (or stopped after a
// migration), and makes a VM stopped after a migration migratable again.
func (m *machine) requirePaused(ctx context.Context, op string) error {
	if err := m.alive(); err != nil {
		return err
	}
	st, err := m.status(ctx)
	if err != nil {
		return fmt.Errorf("%s %s: %w", op, m.id, err)
	}
	switch st {
	case "paused":
		return nil
	case "postmigrate":
		if err := m.leavePostmigrate(ctx); err != nil {
			return fmt.Errorf("%s %s: %w", op, m.id, err)
		}
		return nil
	default:
		return fmt.Errorf("%s %s: vm is %s: %w", op, m.id, st, vmm.ErrNotPaused)
	}
}

// leavePostmigrate readies a VM that already took a snapshot (or had one
// fail) during this pause for another. QEMU refuses to migrate from the
// postmigrate run state, in which a completed migration also left the disks
// inactive, and the only way out without a reset is to run: so the vCPUs
// run for an instant (cont reactivates the disks) and stop again. The guest
// moves on by those milliseconds, as if paused a moment later.
func (m *machine) leavePostmigrate(ctx context.Context) error {
	if err := m.qmp.Execute(ctx, "cont", nil, nil); err != nil {
		return fmt.Errorf("leave postmigrate: %w", err)
	}
	if err := m.qmp.Execute(ctx, "stop", nil, nil); err != nil {
		return fmt.Errorf("leave postmigrate: %w", err)
	}
	m.log.Info("vm ran for an instant to leave the postmigrate state before another snapshot")
	return nil
}

// maxDeviceState bounds a device-only state. Our machines' device state is
// tens of KiB; far more means something other than device state was saved.
const maxDeviceState = 16 << 20
