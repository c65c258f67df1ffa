package orchestrator

import (
	"context"
	"fmt"
	"path"
	"strings"

	"github.com/agentenv/agentenv/disk"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/volume"
)

// Volumes (package volume) on sandboxes. A create's volume mount is an
// extra drive (drives.go) whose image is the volume's sealed layers: a
// read-write mount stacks the sandbox's own upper on them, which pauses
// seal with the other drives; a read-only one exports the layers alone.
// After the VM is up (create, resume) the guest mounts the drive's
// filesystem at the mount's path through the agent. A kill has the guest
// flush and freeze its writes (freezeVolumes), seals the upper and commits
// the sandbox's layers of the drive to the volume (volume.Store.Commit),
// which the next mount sees. A snapshot (a fork's among them) carries a
// copy of each volume as of then (disk.CopyDrivesInto): a sandbox created from
// it, a fork child, mounts its own copy-on-write view of that copy at the
// same path, which dies with it and never goes back to the volume.

// maxMountPath bounds a mount path (Linux's PATH_MAX is 4096).
const maxMountPath = 1024

// guestMountWait bounds the guest's mount of a sandbox's volumes.
const guestMountWait = guestSyncWait

// VolumeMount is a create's volume: mounted at Path in the guest.
type VolumeMount struct {
	Volume   string // the volume's id or name
	Path     string
	ReadOnly bool
}

// Volumes is the node's volume store.
func (o *Orchestrator) Volumes() *volume.Store { return o.volumes }

// CheckVolumeMounts validates a create's volume mounts without looking
// anything up.
func CheckVolumeMounts(ms []VolumeMount) error {
	if len(ms) > disk.MaxDrives {
		return fmt.Errorf("volumeMounts: %d given, at most %d: %w", len(ms), disk.MaxDrives, ErrInvalid)
	}
	seen := map[string]bool{}
	for i, m := range ms {
		switch {
		case m.Volume == "":
			return fmt.Errorf("volumeMounts[%d]: name the volume: %w", i, ErrInvalid)
		case len(m.Path) > maxMountPath || !path.IsAbs(m.Path) || path.Clean(m.Path) != m.Path || m.Path == "/" ||
			strings.ContainsAny(m.Path, "\x00\n"):
			return fmt.Errorf("volumeMounts[%d]: path %q: want a clean absolute path other than /, at most %d bytes: %w", i, m.Path, maxMountPath, ErrInvalid)
		case seen[m.Path]:
			return fmt.Errorf("volumeMounts[%d]: path %q is mounted twice: %w", i, m.Path, ErrInvalid)
		}
		seen[m.Path] = true
	}
	return nil
}

// acquireVolumes records sandbox id's mounts in the volume store and
// returns them as drive requests; on error none is held.
func (o *Orchestrator) acquireVolumes(id string, ms []VolumeMount) ([]disk.DriveRequest, error) {
	var out []disk.DriveRequest
	for _, m := range ms {
		v, err := o.volumes.Acquire(m.Volume, id, m.ReadOnly)
		if err != nil {
			for _, r := range out {
				o.releaseVolume(r.Volume.ID, id)
			}
			return nil, fmt.Errorf("mount volume %q at %s: %w", m.Volume, m.Path, err)
		}
		out = append(out, disk.DriveRequest{ReadOnly: m.ReadOnly, Volume: &v, MountPath: m.Path})
	}
	return out, nil
}

func (o *Orchestrator) releaseVolume(volID, sandboxID string) {
	if err := o.volumes.Release(volID, sandboxID); err != nil {
		o.log.Warn("release volume (the next start releases it)", "volume", volID, "sandbox", sandboxID, "err", err)
	}
}

// hasMounts reports whether the guest of rec mounts a drive (a volume or
// a snapshot's copy of one).
func hasMounts(rec sandbox.Record) bool {
	for _, d := range rec.Drives {
		if d.MountPath != "" {
			return true
		}
	}
	return false
}

// writesVolumes reports whether rec mounts a volume read-write.
func writesVolumes(rec sandbox.Record) bool {
	for _, d := range rec.Drives {
		if d.Volume != "" && !d.ReadOnly {
			return true
		}
	}
	return false
}

// mountScript mounts a guest disk ($2) at a path ($1) with options ($3)
// unless something is mounted there already (a resume with memory keeps
// its mounts). Arguments, not text in the script: a path is never shell.
const mountScript = `mkdir -p -- "$1" && { mountpoint -q -- "$1" || mount -t ext4 -o "$3" -- "$2" "$1"; }`

// mountVolumes (op held, VM running) has the guest mount each volume of s
// at its path.
func (o *Orchestrator) mountVolumes(ctx context.Context, s *instance) error {
	s.mu.Lock()
	rec, slot := s.rec, s.slot()
	s.mu.Unlock()
	if !hasMounts(rec) || slot == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, guestMountWait)
	defer cancel()
	for _, d := range rec.Drives {
		if d.MountPath == "" {
			continue
		}
		// A read-only disk cannot replay a journal: noload reads the
		// filesystem as the last writer's commit left it.
		opts := "rw"
		if d.ReadOnly {
			opts = "ro,noload"
		}
		err := sandbox.RunAsRoot(ctx, slot, rec.GuestToken, "/bin/sh", "-c", mountScript, "mount-volume", d.MountPath, "/dev/"+sandbox.GuestDisk(d.Slot), opts)
		if err != nil {
			return fmt.Errorf("mount volume %s (%s) at %s in sandbox %s: %w", d.VolumeName, sandbox.GuestDisk(d.Slot), d.MountPath, rec.ID, err)
		}
	}
	return nil
}

// freezeScript flushes the guest's writes and freezes the filesystems at
// its arguments: a freeze checkpoints ext4's journal and marks it clean,
// so a read-only mount (which cannot replay a journal) sees every write.
const freezeScript = `sync; for p; do fsfreeze -f -- "$p" || exit 1; done`

// freezeVolumes (op held, VM running, about to be killed) has the guest
// flush and freeze its read-write volumes; a failure is logged: the kill
// goes on and the volume keeps what reached the disk, as after a crash.
func (o *Orchestrator) freezeVolumes(ctx context.Context, s *instance) {
	s.mu.Lock()
	rec, slot := s.rec, s.slot()
	s.mu.Unlock()
	if slot == nil {
		return
	}
	argv := []string{"/bin/sh", "-c", freezeScript, "freeze-volumes"}
	for _, d := range rec.Drives {
		if d.Volume != "" && !d.ReadOnly {
			argv = append(argv, d.MountPath)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, guestSyncWait)
	defer cancel()
	if err := sandbox.RunAsRoot(ctx, slot, rec.GuestToken, argv...); err != nil {
		o.log.Warn("the guest did not flush its volumes before the kill; what it had not written is lost as in a crash",
			"sandbox", rec.ID, "err", err)
	}
}

// returnVolumes (op held, VM stopped, devices still there) hands s's
// volumes back to the store: a killed sandbox's read-write volume gets the
// sandbox's writes committed (its upper sealed first when the device
// lives); any other mount is released.
func (o *Orchestrator) returnVolumes(ctx context.Context, s *instance) {
	s.mu.Lock()
	rec := s.rec
	s.mu.Unlock()
	for _, d := range rec.Drives {
		if d.Volume == "" {
			continue
		}
		if d.ReadOnly || rec.State != sandbox.Killing {
			o.releaseVolume(d.Volume, rec.ID)
			continue
		}
		cfg := d.Config
		var err error
		if d.HasDevice {
			one := sandbox.Record{ID: rec.ID, Dir: rec.Dir, Device: d.Device, HasDevice: true}
			cfg, err = o.disks.SealDevice(ctx, one, fmt.Sprintf("drive%d-%d-final", d.Slot, rec.Gen), "sandbox "+rec.ID+" volume "+d.VolumeName, keepUpper)
		}
		if err == nil {
			err = o.volumes.Commit(d.Volume, rec.ID, cfg, rec.Dir)
		}
		if err != nil {
			o.log.Error("commit a killed sandbox's writes to its volume; they are lost", "volume", d.VolumeName, "sandbox", rec.ID, "err", err)
			o.releaseVolume(d.Volume, rec.ID)
			continue
		}
		volID := d.Volume
		o.goBackground(func() {
			if err := o.volumes.Compact(context.WithoutCancel(ctx), volID); err != nil {
				o.log.Warn("merge a volume's layers (the next commit retries)", "volume", volID, "err", err)
			}
		})
	}
}
