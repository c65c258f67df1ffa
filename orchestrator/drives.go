package orchestrator

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/agentenv/agentenv/disk"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/template"
	"github.com/agentenv/agentenv/vmm"
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
	// volume, when set, is the volume the drive mounts at mountPath
	// (volumes.go): the drive stacks on its layers.
	volume    *volume.Volume
	mountPath string
}

// AttachedDrive is a drive of a sandbox's record with its live device.
type AttachedDrive struct {
	snapshot.Drive
	Device    uint32 `json:"device,omitempty"`
	HasDevice bool   `json:"hasDevice,omitempty"`
	// Fresh: the guest has not seen the drive yet (its slot was empty in
	// the snapshot the sandbox starts from); the next /init has it probed.
	Fresh bool `json:"fresh,omitempty"`
	// Volume is the id of the volume the drive is (volumes.go), mounted
	// in the guest at MountPath; VolumeName its name.
	Volume     string `json:"volume,omitempty"`
	VolumeName string `json:"volumeName,omitempty"`
}

// CheckDrives validates a create's drives without looking anything up.
func CheckDrives(reqs []DriveRequest) error {
	if len(reqs) > MaxDrives {
		return fmt.Errorf("drives: %d given, at most %d: %w", len(reqs), MaxDrives, ErrInvalid)
	}
	for i, r := range reqs {
		switch {
		case r.Image == "" && r.SizeMiB == 0:
			return fmt.Errorf("drives[%d]: set image (a template or snapshot) or sizeMiB (a blank volume): %w", i, ErrInvalid)
		case r.Image != "" && r.SizeMiB != 0:
			return fmt.Errorf("drives[%d]: image and sizeMiB exclude each other (an image drive has the image's size): %w", i, ErrInvalid)
		case r.Image != "" && !snapshot.ValidName.MatchString(r.Image):
			return fmt.Errorf("drives[%d]: image %q is no template or snapshot id or name: %w", i, r.Image, ErrInvalid)
		case r.Image == "" && (r.SizeMiB < minDriveMiB || r.SizeMiB > MaxDriveMiB):
			return fmt.Errorf("drives[%d]: sizeMiB %d out of range %d..%d: %w", i, r.SizeMiB, minDriveMiB, MaxDriveMiB, ErrInvalid)
		case r.Image == "" && r.ReadOnly:
			return fmt.Errorf("drives[%d]: a blank volume cannot be read-only: %w", i, ErrInvalid)
		}
	}
	return nil
}

// planDrives (refMu held) gives a sandbox created from t its drives: the
// ones t's snapshot carries, then reqs in the free slots, their images
// resolved. Blank volumes get their config in prepareDrives.
func (o *Orchestrator) planDrives(t *template.Template, reqs []DriveRequest) ([]AttachedDrive, error) {
	var out []AttachedDrive
	used := map[int]bool{}
	for _, d := range t.Drives {
		out = append(out, AttachedDrive{Drive: d})
		used[d.Slot] = true
	}
	if len(reqs) == 0 {
		return out, nil
	}
	if free := t.DriveSlots - len(t.Drives); len(reqs) > free {
		return nil, fmt.Errorf("drives: %s has %d free drive slots (of %d), %d drives asked (a template built before drive slots existed has none; rebuild it): %w",
			t.ID, max(free, 0), t.DriveSlots, len(reqs), ErrInvalid)
	}
	slot := 1
	for _, r := range reqs {
		for used[slot] {
			slot++
		}
		used[slot] = true
		d := snapshot.Drive{Slot: slot, Image: r.Image, SizeMiB: r.SizeMiB, ReadOnly: r.ReadOnly}
		if v := r.volume; v != nil {
			d.SizeMiB, d.Config, d.MountPath = v.SizeMiB, v.Config, r.mountPath
			out = append(out, AttachedDrive{Drive: d, Fresh: true, Volume: v.ID, VolumeName: v.Name})
			continue
		}
		if r.Image != "" {
			src, err := o.source(r.Image)
			if err != nil {
				return nil, fmt.Errorf("drive %s: %w", sandbox.GuestDisk(slot), err)
			}
			if src.RootfsImage == "" {
				return nil, fmt.Errorf("drive %s: %s has no layered root disk: %w", sandbox.GuestDisk(slot), src.ID, ErrInvalid)
			}
			d.Image, d.Config = src.ID, src.RootfsImage
		}
		out = append(out, AttachedDrive{Drive: d, Fresh: true})
	}
	return out, nil
}

// prepareDrives writes the base layer of every new blank volume of rec
// (an empty sealed layer of its size) and points the drive at it.
func prepareDrives(ctx context.Context, rec *Record) error {
	for i := range rec.Drives {
		d := &rec.Drives[i]
		if d.Config != "" {
			continue
		}
		base := filepath.Join(rec.Dir, fmt.Sprintf("drive%d-base", d.Slot))
		if err := disk.BlankLayer(ctx, base, int64(d.SizeMiB)<<20); err != nil {
			return fmt.Errorf("drive %s: %w", sandbox.GuestDisk(d.Slot), err)
		}
		d.Config = base + ".json"
	}
	return nil
}

// vmDrives is the slot list of s's VM (sandbox.Spec.Drives).
func (o *Orchestrator) vmDrives(s *instance, rec Record) []sandbox.Disk {
	slots := make([]sandbox.Disk, rec.DriveSlots)
	for i, d := range rec.Drives {
		if d.Slot >= 1 && d.Slot <= len(slots) {
			slots[d.Slot-1] = driveDisk{o: o, s: s, i: i}
		}
	}
	return slots
}

// freshDisks names the guest disks of drives the guest has not seen.
func freshDisks(rec Record) []string {
	var out []string
	for _, d := range rec.Drives {
		if d.Fresh {
			out = append(out, sandbox.GuestDisk(d.Slot))
		}
	}
	return out
}

// driveDisk is drive i of a sandbox as a VM bring-up sees it: attach
// records its device in the sandbox, detach releases it.
type driveDisk struct {
	o *Orchestrator
	s *instance
	i int
}

func (d driveDisk) Attach(ctx context.Context, as *vmm.Identity) (vmm.Drive, error) {
	d.s.mu.Lock()
	owner, drive := d.s.rec.ID, d.s.rec.Drives[d.i].Drive
	d.s.mu.Unlock()
	vd, dev, err := d.o.disks.AttachDrive(ctx, owner, sandbox.SlotID(drive.Slot), drive, as)
	if err != nil {
		return vd, err
	}
	d.s.mu.Lock()
	d.s.rec.Drives[d.i].Device, d.s.rec.Drives[d.i].HasDevice = dev, true
	d.s.mu.Unlock()
	return vd, nil
}

func (d driveDisk) Detach(ctx context.Context) {
	d.s.mu.Lock()
	ad := &d.s.rec.Drives[d.i]
	dev, has, owner := ad.Device, ad.HasDevice, d.s.rec.ID
	ad.Device, ad.HasDevice = 0, false
	d.s.mu.Unlock()
	if has {
		d.o.disks.Detach(ctx, owner, dev)
	}
}

// diskConfigs are the image configs of the record's root disk and drives.
type diskConfigs struct {
	rootfs string
	drives []string
}

// diskConfigs copies the record's image configs (a seal replaces them).
func (r Record) diskConfigs() diskConfigs {
	c := diskConfigs{rootfs: r.RootfsImage}
	for _, d := range r.Drives {
		c.drives = append(c.drives, d.Config)
	}
	return c
}

// setDiskConfigs puts back configs diskConfigs copied.
func (r *Record) setDiskConfigs(c diskConfigs) {
	r.RootfsImage = c.rootfs
	for i := range r.Drives {
		if i < len(c.drives) {
			r.Drives[i].Config = c.drives[i]
		}
	}
}

// devices lists the storage-daemon devices r holds: its root disk's and
// its drives'.
func (r Record) devices() []uint32 {
	var out []uint32
	if r.HasDevice {
		out = append(out, r.Device)
	}
	for _, d := range r.Drives {
		if d.HasDevice {
			out = append(out, d.Device)
		}
	}
	return out
}

// clearDevices forgets every device of r (they were deleted).
func (r *Record) clearDevices() {
	r.Device, r.HasDevice = 0, false
	for i := range r.Drives {
		r.Drives[i].Device, r.Drives[i].HasDevice = 0, false
	}
}

// deleteDevices deletes every device r holds (recovery; a device already
// gone is no error).
func deleteDevices(ctx context.Context, disks *disk.Manager, r Record) error {
	return disks.DeleteDevices(ctx, "sandbox "+r.ID, r.devices())
}

// sealDrives (vCPUs stopped) seals the upper of every writable drive of
// rec into a layer drive<slot>-<tag> and returns the drives pointed at
// the configs listing their layers now; read-only drives never change.
func sealDrives(ctx context.Context, disks *disk.Manager, rec Record, tag, message string, mode disk.SealMode) ([]AttachedDrive, error) {
	out := append([]AttachedDrive(nil), rec.Drives...)
	for i, d := range out {
		if d.ReadOnly {
			continue
		}
		if !d.HasDevice {
			return nil, fmt.Errorf("seal drive %s of %s: no device", sandbox.GuestDisk(d.Slot), rec.ID)
		}
		one := Record{ID: rec.ID, Dir: rec.Dir, Device: d.Device, HasDevice: true}
		cfg, err := sealDevice(ctx, disks, one, fmt.Sprintf("drive%d-%s", d.Slot, tag), message, mode)
		if err != nil {
			return nil, fmt.Errorf("drive %s: %w", sandbox.GuestDisk(d.Slot), err)
		}
		out[i].Config = cfg
	}
	return out, nil
}

// sealSandboxDrives seals the writable drives of a sandbox being paused
// (see sealDrives; the devices keep their uppers and go next) and points
// the record (in memory; the caller persists) at their sealed configs.
func (o *Orchestrator) sealSandboxDrives(ctx context.Context, s *instance, tag, message string) error {
	s.mu.Lock()
	rec := s.rec
	s.mu.Unlock()
	if len(rec.Drives) == 0 {
		return nil
	}
	drives, err := sealDrives(ctx, o.disks, rec, tag, message, keepUpper)
	if err != nil {
		return err
	}
	s.mu.Lock()
	for i := range s.rec.Drives {
		s.rec.Drives[i].Config = drives[i].Config
	}
	s.mu.Unlock()
	return nil
}

// copyDrivesInto gives snapshot directory dir the drives rec has now
// (sealed): a writable drive's layers that live in the sandbox's directory
// are hard-linked into dir; a read-only drive keeps its image's config.
func copyDrivesInto(rec Record, dir string) ([]snapshot.Drive, error) {
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

// plainDrives is drives without their devices.
func plainDrives(drives []AttachedDrive) []snapshot.Drive {
	var out []snapshot.Drive
	for _, d := range drives {
		out = append(out, d.Drive)
	}
	return out
}

// usesImage reports whether one of drives started from template or
// snapshot id.
func usesImage(drives []snapshot.Drive, id string) bool {
	for _, d := range drives {
		if d.Image == id {
			return true
		}
	}
	return false
}

// deepDrives lists the indexes of rec's drives whose chains are deeper
// than the node's maximum (see compact.go).
func (o *Orchestrator) deepDrives(rec Record) []int {
	var out []int
	for i, d := range rec.Drives {
		if !d.ReadOnly && len(snapshot.Refs(d.Config)) > o.maxLayers() {
			out = append(out, i)
		}
	}
	return out
}

// compactDrives (op held, paused) merges the sandbox's own layers of each
// drive that is too deep, records the new configs and returns the layers
// merged away.
func (o *Orchestrator) compactDrives(ctx context.Context, s *instance, rec Record) ([]string, error) {
	var obsolete []string
	for _, i := range o.deepDrives(rec) {
		d := rec.Drives[i]
		name := fmt.Sprintf("drive%d-%d-merged", d.Slot, rec.Gen)
		merged, old, err := snapshot.MergeOwned(ctx, snapshot.Refs(d.Config), rec.Dir, name+".lsmt", snapshot.MergeLayers)
		if err != nil {
			return nil, fmt.Errorf("drive %s: %w", sandbox.GuestDisk(d.Slot), err)
		}
		cfg := filepath.Join(rec.Dir, name+".json")
		if err := snapshot.WriteImageConfig(cfg, merged); err != nil {
			return nil, err
		}
		if err := o.update(s, func(r *Record) { r.Drives[i].Config = cfg }); err != nil {
			return nil, err
		}
		obsolete = append(obsolete, old...)
	}
	return obsolete, nil
}
