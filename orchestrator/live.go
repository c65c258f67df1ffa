package orchestrator

import (
	"context"

	"github.com/agentenv/agentenv/lifecycle"
	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/vmm"
)

// A registered sandbox as the verbs and the VM bring-up see it: the
// lifecycle.Sandbox (live) whose record changes through the journal
// (transition, update), and its root disk and drives as sandbox.Disk
// (vmDisk, driveDisk), which record their devices in it.

// live is a registered sandbox as the verbs of package lifecycle see it
// (lifecycle.Sandbox, and lifecycle.Newborn for a create); its operation
// lock is held.
type live struct {
	o *Orchestrator
	s *instance
}

func (o *Orchestrator) live(s *instance) lifecycle.Sandbox { return live{o, s} }

func (l live) Record() sandbox.Record {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	return l.s.rec
}

func (l live) Machine() vmm.Machine {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	return l.s.machine()
}

func (l live) Slot() *network.Slot {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	return l.s.slot()
}

func (l live) Adopted() bool { return false }

// RecordNew writes a new sandbox's first record, in state starting
// (lifecycle.Newborn): a crash from here on is rolled back by recovery.
func (l live) RecordNew() error {
	rec := l.Record()
	rec.State = "" // not written yet
	return l.o.journal.Transition(rec, sandbox.Starting, nil, func(r sandbox.Record) { l.o.setRecord(l.s, r) })
}

func (l live) Transition(to sandbox.State, change func(*sandbox.Record)) error {
	return l.o.transition(l.s, to, change)
}

func (l live) Update(change func(*sandbox.Record)) error { return l.o.update(l.s, change) }

func (l live) Set(change func(*sandbox.Record)) {
	l.s.mu.Lock()
	change(&l.s.rec)
	l.s.mu.Unlock()
}

func (l live) StopVM(ctx context.Context)         { l.o.stopVM(ctx, l.s) }
func (l live) ReleaseDevices(ctx context.Context) { l.o.releaseDevice(ctx, l.s) }

// removal is what a kill or removal of s does beyond the sandbox's own
// resources (lifecycle.Removal): its volumes go back, its timer stops,
// and the registry, the repository's uploads, the lazy disks and the
// memory flattens forget it.
func (o *Orchestrator) removal(s *instance) lifecycle.Removal {
	return lifecycle.Removal{
		Volumes: func(ctx context.Context, _ sandbox.Record) { o.returnVolumes(ctx, s) },
		Forget: func(rec sandbox.Record) {
			o.stopTimer(s)
			o.unlist(s)
			o.afterRemoved(rec) // the repository cancels its pause uploads
			o.disks.Forget(rec.Dir)
			o.mem.StopFlatten(rec.ID)
		},
	}
}

// captureMemory writes a running sandbox's memory and VM state into a
// snapshot's VM directory (memimage.Images.Capture).
func (o *Orchestrator) captureMemory(ctx context.Context, s lifecycle.Sandbox, vmDir, diff string) error {
	rec := s.Record()
	return o.mem.Capture(ctx, rec.ID, s.Machine(), rec.Memory, vmDir, diff)
}

// persist writes the sandbox's record (op held); its state is unchanged
// (sandbox.Journal.Put).
func (o *Orchestrator) persist(s *instance) error {
	s.mu.Lock()
	rec := s.rec
	s.mu.Unlock()
	return o.journal.Put(rec)
}

// update changes fields of the sandbox's record other than its state (op
// held) and persists them; the sandbox's copy changes once they are
// durable.
func (o *Orchestrator) update(s *instance, f func(r *sandbox.Record)) error {
	s.mu.Lock()
	rec := s.rec
	s.mu.Unlock()
	f(&rec)
	if err := o.journal.Put(rec); err != nil {
		return err
	}
	o.setRecord(s, rec)
	return nil
}

// transition moves the sandbox to state to with change applied (op held):
// the one way a live sandbox's state changes (sandbox.Journal.Transition).
func (o *Orchestrator) transition(s *instance, to sandbox.State, change func(r *sandbox.Record)) error {
	s.mu.Lock()
	rec := s.rec
	s.mu.Unlock()
	return o.journal.Transition(rec, to, change, func(r sandbox.Record) { o.setRecord(s, r) })
}

// setRecord replaces the sandbox's copy of its record.
func (o *Orchestrator) setRecord(s *instance, rec sandbox.Record) {
	s.mu.Lock()
	s.rec = rec
	s.mu.Unlock()
}

// vmDisk is a sandbox's root disk as a VM bring-up sees it
// (sandbox.Disk): attach records the device in the sandbox.
type vmDisk struct {
	o *Orchestrator
	s *instance
}

func (d vmDisk) Attach(ctx context.Context, as *vmm.Identity) (vmm.Drive, error) {
	d.s.mu.Lock()
	rec := d.s.rec
	d.s.mu.Unlock()
	drive, dev, err := d.o.disks.Attach(ctx, rec.ID, rec.RootfsImage, as)
	if err != nil {
		return drive, err
	}
	d.s.mu.Lock()
	d.s.rec.Device, d.s.rec.HasDevice = dev, true
	d.s.mu.Unlock()
	return drive, nil
}

func (d vmDisk) Detach(ctx context.Context) { d.o.releaseDevice(ctx, d.s) }

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
