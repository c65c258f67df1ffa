package orchestrator

import (
	"context"

	"github.com/agentenv/agentenv/disk"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/store"
	"github.com/agentenv/agentenv/vmm"
)

// The node's disks live on the storage daemon (package disk, chosen once in
// New): a template's rootfs is a stack of sealed layers; each VM gets an
// export of those layers plus a fresh writable upper; a seal restacks the
// upper into a new layer and the sandbox's image config lists it on top.
// What follows ties them to sandbox records.

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

// releaseDevice releases the sandbox's devices: its root disk's and its
// drives'.
func (o *Orchestrator) releaseDevice(ctx context.Context, s *instance) {
	s.mu.Lock()
	ids, id := s.rec.Devices(), s.rec.ID
	s.rec.ClearDevices()
	s.mu.Unlock()
	for _, dev := range ids {
		o.disks.Detach(ctx, id, dev)
	}
}

// localizeAll has the disks move every image config a record names that
// still reads remote layers onto local files (a restart; disk.Localize).
func (o *Orchestrator) localizeAll(ctx context.Context) {
	var cfgs []string
	for _, r := range o.List() {
		cfgs = append(cfgs, r.RootfsImage)
	}
	snaps, _ := store.ListAll[snapshot.Record](o.store, store.Snapshots)
	for _, r := range snaps {
		cfgs = append(cfgs, r.RootfsImage)
	}
	for _, t := range o.Templates() {
		cfgs = append(cfgs, t.RootfsImage)
	}
	o.disks.Localize(ctx, cfgs)
}

// lazyMoved: cfg's layers are local; a template's disks get their warm
// pool now (none is made from remote layers).
func (o *Orchestrator) lazyMoved(cfg string) {
	for _, t := range o.Templates() {
		if t.RootfsImage == cfg {
			o.disks.Warm(context.Background(), &t)
		}
	}
}

// isDevice reports whether a memory image's File is a device path.
func isDevice(file string) bool { return disk.IsDevice(file) }
