package disk

import (
	"context"
	"fmt"

	"github.com/agentenv/agentenv/sandbox"
)

// The disks of a sandbox record: its root disk device and its extra
// drives' devices, named as the manager names devices.

// HeldOf is the record's root disk device as the manager names it.
func HeldOf(r sandbox.Record) Held {
	return Held{Owner: r.ID, Dir: r.Dir, Device: r.Device, Has: r.HasDevice}
}

// SealDevice seals rec's root disk device (Seal).
func (m *Manager) SealDevice(ctx context.Context, rec sandbox.Record, name, message string, mode SealMode) (string, error) {
	return m.Seal(ctx, HeldOf(rec), name, message, mode)
}

// DeleteRecordDevices deletes every device r holds (recovery; a device already
// gone is no error).
func (m *Manager) DeleteRecordDevices(ctx context.Context, r sandbox.Record) error {
	return m.DeleteDevices(ctx, "sandbox "+r.ID, r.Devices())
}

// SealDrives (vCPUs stopped) seals the upper of every writable drive of
// rec into a layer drive<slot>-<tag> and returns the drives pointed at
// the configs listing their layers now; read-only drives never change.
func (m *Manager) SealDrives(ctx context.Context, rec sandbox.Record, tag, message string, mode SealMode) ([]sandbox.AttachedDrive, error) {
	out := append([]sandbox.AttachedDrive(nil), rec.Drives...)
	for i, d := range out {
		if d.ReadOnly {
			continue
		}
		if !d.HasDevice {
			return nil, fmt.Errorf("seal drive %s of %s: no device", sandbox.GuestDisk(d.Slot), rec.ID)
		}
		one := sandbox.Record{ID: rec.ID, Dir: rec.Dir, Device: d.Device, HasDevice: true}
		cfg, err := m.SealDevice(ctx, one, fmt.Sprintf("drive%d-%s", d.Slot, tag), message, mode)
		if err != nil {
			return nil, fmt.Errorf("drive %s: %w", sandbox.GuestDisk(d.Slot), err)
		}
		out[i].Config = cfg
	}
	return out, nil
}
