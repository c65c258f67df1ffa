package disk

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/template"
	"github.com/agentenv/agentenv/volume"
)

// Extra drives. A VM's device set is fixed when its VMM starts and a
// restore must bring the set of the snapshot, so drives go into slots
// every template's VM is booted with (sandbox.DriveSlots): empty disks the
// guest probed at boot. A create fills free slots with its drives and the
// agent's /init has the guest probe those again (their size and read-only
// flag change); a pause, a snapshot or a fork carries the filled slots
// along. Each drive is a storage-daemon device of its own, held, sealed
// and released with the root disk's.

// Limits of a create's drives.
const (
	MaxDrives   = sandbox.MaxDriveSlots
	MaxDriveMiB = 64 << 10 // a blank volume: sparse, so only what is written takes space
	minDriveMiB = 1
)

// DriveRequest is one extra drive of a create: exactly one of Image (a
// template or snapshot whose root disk the drive stacks on, read-only or
// copy-on-write) and SizeMiB (a blank writable volume of that size).
type DriveRequest struct {
	Image    string
	SizeMiB  int
	ReadOnly bool
	// Volume, when set, is the volume the drive mounts at MountPath:
	// the drive stacks on its layers.
	Volume    *volume.Volume
	MountPath string
}

// CheckDrives validates a create's drives without looking anything up.
func CheckDrives(reqs []DriveRequest) error {
	if len(reqs) > MaxDrives {
		return fmt.Errorf("drives: %d given, at most %d: %w", len(reqs), MaxDrives, errdefs.ErrInvalid)
	}
	for i, r := range reqs {
		switch {
		case r.Image == "" && r.SizeMiB == 0:
			return fmt.Errorf("drives[%d]: set image (a template or snapshot) or sizeMiB (a blank volume): %w", i, errdefs.ErrInvalid)
		case r.Image != "" && r.SizeMiB != 0:
			return fmt.Errorf("drives[%d]: image and sizeMiB exclude each other (an image drive has the image's size): %w", i, errdefs.ErrInvalid)
		case r.Image != "" && !snapshot.ValidName.MatchString(r.Image):
			return fmt.Errorf("drives[%d]: image %q is no template or snapshot id or name: %w", i, r.Image, errdefs.ErrInvalid)
		case r.Image == "" && (r.SizeMiB < minDriveMiB || r.SizeMiB > MaxDriveMiB):
			return fmt.Errorf("drives[%d]: sizeMiB %d out of range %d..%d: %w", i, r.SizeMiB, minDriveMiB, MaxDriveMiB, errdefs.ErrInvalid)
		case r.Image == "" && r.ReadOnly:
			return fmt.Errorf("drives[%d]: a blank volume cannot be read-only: %w", i, errdefs.ErrInvalid)
		}
	}
	return nil
}

// PlanDrives gives a sandbox created from t its drives: the
// ones t's snapshot carries, then reqs in the free slots, their images
// resolved by source. Blank volumes get their config in PrepareDrives.
func PlanDrives(t *template.Template, reqs []DriveRequest, source func(idOrName string) (*template.Template, error)) ([]sandbox.AttachedDrive, error) {
	var out []sandbox.AttachedDrive
	used := map[int]bool{}
	for _, d := range t.Drives {
		out = append(out, sandbox.AttachedDrive{Drive: d})
		used[d.Slot] = true
	}
	if len(reqs) == 0 {
		return out, nil
	}
	if free := t.DriveSlots - len(t.Drives); len(reqs) > free {
		return nil, fmt.Errorf("drives: %s has %d free drive slots (of %d), %d drives asked (a template built before drive slots existed has none; rebuild it): %w",
			t.ID, max(free, 0), t.DriveSlots, len(reqs), errdefs.ErrInvalid)
	}
	slot := 1
	for _, r := range reqs {
		for used[slot] {
			slot++
		}
		used[slot] = true
		d := snapshot.Drive{Slot: slot, Image: r.Image, SizeMiB: r.SizeMiB, ReadOnly: r.ReadOnly}
		if v := r.Volume; v != nil {
			d.SizeMiB, d.Config, d.MountPath = v.SizeMiB, v.Config, r.MountPath
			out = append(out, sandbox.AttachedDrive{Drive: d, Fresh: true, Volume: v.ID, VolumeName: v.Name})
			continue
		}
		if r.Image != "" {
			src, err := source(r.Image)
			if err != nil {
				return nil, fmt.Errorf("drive %s: %w", sandbox.GuestDisk(slot), err)
			}
			if src.RootfsImage == "" {
				return nil, fmt.Errorf("drive %s: %s has no layered root disk: %w", sandbox.GuestDisk(slot), src.ID, errdefs.ErrInvalid)
			}
			d.Image, d.Config = src.ID, src.RootfsImage
		}
		out = append(out, sandbox.AttachedDrive{Drive: d, Fresh: true})
	}
	return out, nil
}

// PrepareDrives writes the base layer of every new blank volume of rec
// (an empty sealed layer of its size) and points the drive at it.
func PrepareDrives(ctx context.Context, rec *sandbox.Record) error {
	for i := range rec.Drives {
		d := &rec.Drives[i]
		if d.Config != "" {
			continue
		}
		base := filepath.Join(rec.Dir, fmt.Sprintf("drive%d-base", d.Slot))
		if err := BlankLayer(ctx, base, int64(d.SizeMiB)<<20); err != nil {
			return fmt.Errorf("drive %s: %w", sandbox.GuestDisk(d.Slot), err)
		}
		d.Config = base + ".json"
	}
	return nil
}

// FreshDisks names the guest disks of drives the guest has not seen.
func FreshDisks(rec sandbox.Record) []string {
	var out []string
	for _, d := range rec.Drives {
		if d.Fresh {
			out = append(out, sandbox.GuestDisk(d.Slot))
		}
	}
	return out
}

// CopyDrivesInto gives snapshot directory dir the drives rec has now
// (sealed): a writable drive's layers that live in the sandbox's directory
// are hard-linked into dir; a read-only drive keeps its image's config.
func CopyDrivesInto(rec sandbox.Record, dir string) ([]snapshot.Drive, error) {
	var out []snapshot.Drive
	for _, d := range rec.Drives {
		sd := d.Drive
		if d.Volume != "" {
			cfg, err := copyVolumeDrive(d, dir)
			if err != nil {
				return nil, fmt.Errorf("drive %s: %w", sandbox.GuestDisk(d.Slot), err)
			}
			sd.Config = cfg
		} else if !d.ReadOnly {
			layers, err := snapshot.LayersOf(d.Config)
			if err != nil {
				return nil, fmt.Errorf("drive %s: %w", sandbox.GuestDisk(d.Slot), err)
			}
			own, err := snapshot.AdoptLayers(layers, rec.Dir, dir)
			if err != nil {
				return nil, fmt.Errorf("drive %s: %w", sandbox.GuestDisk(d.Slot), err)
			}
			sd.Config = filepath.Join(dir, fmt.Sprintf("drive%d.json", d.Slot))
			if err := snapshot.WriteImageConfig(sd.Config, own); err != nil {
				return nil, fmt.Errorf("drive %s: %w", sandbox.GuestDisk(d.Slot), err)
			}
		}
		out = append(out, sd)
	}
	return out, nil
}

// PlainDrives is drives without their devices.
func PlainDrives(drives []sandbox.AttachedDrive) []snapshot.Drive {
	var out []snapshot.Drive
	for _, d := range drives {
		out = append(out, d.Drive)
	}
	return out
}

// UsesImage reports whether one of drives started from template or
// snapshot id.
func UsesImage(drives []snapshot.Drive, id string) bool {
	for _, d := range drives {
		if d.Image == id {
			return true
		}
	}
	return false
}

// copyVolumeDrive (a snapshot of the sandbox, its drives sealed) links
// every layer of volume drive d, the volume's own and the sandbox's, into
// snapshot directory dir and returns the config listing them: the
// snapshot's copy of the volume as of now, which outlives the volume and
// never goes back to it (a fork child's copy-on-write view of it).
func copyVolumeDrive(d sandbox.AttachedDrive, dir string) (string, error) {
	layers, err := snapshot.LayersOf(d.Config)
	if err != nil {
		return "", err
	}
	own := make([]string, len(layers))
	for i, l := range layers {
		own[i] = filepath.Join(dir, fmt.Sprintf("drive%d-volume-%d.lsmt", d.Slot, i))
		if err := snapshot.LinkOrCopy(l, own[i]); err != nil {
			return "", err
		}
	}
	cfg := filepath.Join(dir, fmt.Sprintf("drive%d.json", d.Slot))
	return cfg, snapshot.WriteImageConfig(cfg, own)
}
