package orchestrator

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/vmm"
)

// vmDrives is the slot list of s's VM (sandbox.Spec.Drives).
func (o *Orchestrator) vmDrives(s *instance, rec sandbox.Record) []sandbox.Disk {
	slots := make([]sandbox.Disk, rec.DriveSlots)
	for i, d := range rec.Drives {
		if d.Slot >= 1 && d.Slot <= len(slots) {
			slots[d.Slot-1] = driveDisk{o: o, s: s, i: i}
		}
	}
	return slots
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

// deepDrives lists the indexes of rec's drives whose chains are deeper
// than the node's maximum (see compact.go).
func (o *Orchestrator) deepDrives(rec sandbox.Record) []int {
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
func (o *Orchestrator) compactDrives(ctx context.Context, s *instance, rec sandbox.Record) ([]string, error) {
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
		if err := o.update(s, func(r *sandbox.Record) { r.Drives[i].Config = cfg }); err != nil {
			return nil, err
		}
		obsolete = append(obsolete, old...)
	}
	return obsolete, nil
}
