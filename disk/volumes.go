package disk

import (
	"context"
	"fmt"

	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/volume"
)

// Volumes (package volume) on sandboxes. A create's volume mount is an
// extra drive (drives.go) whose image is the volume's sealed layers: a
// read-write mount stacks the sandbox's own upper on them, which pauses
// seal with the other drives; a read-only one exports the layers alone.
// After the VM is up (create, resume) the guest mounts the drive's
// filesystem at the mount's path (sandbox.MountVolumes). A kill has the
// guest flush and freeze its writes (sandbox.FreezeVolumes), seals the
// upper and commits the sandbox's layers of the drive to the volume
// (ReturnVolumes), which the next mount sees. A snapshot (a fork's among
// them) carries a copy of each volume as of then (CopyDrivesInto): a
// sandbox created from it, a fork child, mounts its own copy-on-write view
// of that copy at the same path, which dies with it and never goes back to
// the volume.

// CheckVolumeMounts validates a create's volume mounts (at most MaxDrives).
func CheckVolumeMounts(ms []volume.Mount) error { return volume.CheckMounts(ms, MaxDrives) }

// AcquireVolumes records sandbox id's mounts in the volume store and
// returns them as drive requests; on error none is held.
func (m *Manager) AcquireVolumes(vols *volume.Store, id string, ms []volume.Mount) ([]DriveRequest, error) {
	var out []DriveRequest
	for _, mt := range ms {
		v, err := vols.Acquire(mt.Volume, id, mt.ReadOnly)
		if err != nil {
			for _, r := range out {
				m.ReleaseVolume(vols, r.Volume.ID, id)
			}
			return nil, fmt.Errorf("mount volume %q at %s: %w", mt.Volume, mt.Path, err)
		}
		out = append(out, DriveRequest{ReadOnly: mt.ReadOnly, Volume: &v, MountPath: mt.Path})
	}
	return out, nil
}

// ReleaseVolume gives sandbox sandboxID's hold of volume volID back; a
// failure is logged (the next start releases it).
func (m *Manager) ReleaseVolume(vols *volume.Store, volID, sandboxID string) {
	if err := vols.Release(volID, sandboxID); err != nil {
		m.log.Warn("release volume (the next start releases it)", "volume", volID, "sandbox", sandboxID, "err", err)
	}
}

// ReturnVolumes (VM stopped, devices still there) hands rec's volumes
// back to the store: a killed sandbox's read-write volume gets the
// sandbox's writes committed (its upper sealed first when the device
// lives); any other mount is released. It returns the volumes committed
// to, whose layers the caller may merge (volume.Store.Compact).
func (m *Manager) ReturnVolumes(ctx context.Context, vols *volume.Store, rec sandbox.Record) []string {
	var committed []string
	for _, d := range rec.Drives {
		if d.Volume == "" {
			continue
		}
		if d.ReadOnly || rec.State != sandbox.Killing {
			m.ReleaseVolume(vols, d.Volume, rec.ID)
			continue
		}
		cfg := d.Config
		var err error
		if d.HasDevice {
			one := sandbox.Record{ID: rec.ID, Dir: rec.Dir, Device: d.Device, HasDevice: true}
			cfg, err = m.SealDevice(ctx, one, fmt.Sprintf("drive%d-%d-final", d.Slot, rec.Gen), "sandbox "+rec.ID+" volume "+d.VolumeName, KeepUpper)
		}
		if err == nil {
			err = vols.Commit(d.Volume, rec.ID, cfg, rec.Dir)
		}
		if err != nil {
			m.log.Error("commit a killed sandbox's writes to its volume; they are lost", "volume", d.VolumeName, "sandbox", rec.ID, "err", err)
			m.ReleaseVolume(vols, d.Volume, rec.ID)
			continue
		}
		committed = append(committed, d.Volume)
	}
	return committed
}
