package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/agentenv/agentenv/network"
)

// The guest's side of volumes (package volume) and of a filesystem-only
// pause: a running guest mounts its volume drives, flushes and freezes
// them before a kill, and flushes its disks before a pause without memory.
// Each runs a fixed script through the agent, as root; paths are passed as
// arguments, never as text in the script.

// GuestSyncWait bounds the guest's flush before a filesystem-only pause or
// a kill, and its mount of the volumes.
const GuestSyncWait = 30 * time.Second

// HasMounts reports whether the guest of rec mounts a drive (a volume or
// a snapshot's copy of one).
func HasMounts(rec Record) bool {
	for _, d := range rec.Drives {
		if d.MountPath != "" {
			return true
		}
	}
	return false
}

// WritesVolumes reports whether rec mounts a volume read-write.
func WritesVolumes(rec Record) bool {
	for _, d := range rec.Drives {
		if d.Volume != "" && !d.ReadOnly {
			return true
		}
	}
	return false
}

// mountScript mounts a guest disk ($2) at a path ($1) with options ($3)
// unless something is mounted there already (a resume with memory keeps
// its mounts).
const mountScript = `mkdir -p -- "$1" && { mountpoint -q -- "$1" || mount -t ext4 -o "$3" -- "$2" "$1"; }`

// MountVolumes has the guest of rec, running in slot, mount each of its
// mounted drives at its path.
func MountVolumes(ctx context.Context, slot *network.Slot, rec Record) error {
	if !HasMounts(rec) || slot == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, GuestSyncWait)
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
		err := RunAsRoot(ctx, slot, rec.GuestToken, "/bin/sh", "-c", mountScript, "mount-volume", d.MountPath, "/dev/"+GuestDisk(d.Slot), opts)
		if err != nil {
			return fmt.Errorf("mount volume %s (%s) at %s in sandbox %s: %w", d.VolumeName, GuestDisk(d.Slot), d.MountPath, rec.ID, err)
		}
	}
	return nil
}

// freezeScript flushes the guest's writes and freezes the filesystems at
// its arguments: a freeze checkpoints ext4's journal and marks it clean,
// so a read-only mount (which cannot replay a journal) sees every write.
const freezeScript = `sync; for p; do fsfreeze -f -- "$p" || exit 1; done`

// FreezeVolumes has the guest of rec, running in slot and about to be
// killed, flush and freeze its read-write volumes.
func FreezeVolumes(ctx context.Context, slot *network.Slot, rec Record) error {
	if slot == nil {
		return nil
	}
	argv := []string{"/bin/sh", "-c", freezeScript, "freeze-volumes"}
	for _, d := range rec.Drives {
		if d.Volume != "" && !d.ReadOnly {
			argv = append(argv, d.MountPath)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, GuestSyncWait)
	defer cancel()
	if err := RunAsRoot(ctx, slot, rec.GuestToken, argv...); err != nil {
		return fmt.Errorf("freeze the volumes of sandbox %s: %w", rec.ID, err)
	}
	return nil
}
