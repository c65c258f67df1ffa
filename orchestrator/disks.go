package orchestrator

import (
	"context"
	"fmt"

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

// What a seal leaves the device on (disk.SealMode).
const (
	restackUpper = disk.RestackUpper
	keepUpper    = disk.KeepUpper
)

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
	ids, id := s.rec.devices(), s.rec.ID
	s.rec.clearDevices()
	s.mu.Unlock()
	for _, dev := range ids {
		o.disks.Detach(ctx, id, dev)
	}
}

// sealRootfs seals the disk of a sandbox being paused (disk.SealRoot; the
// device keeps its upper and goes next) and points the record (in memory;
// the caller persists) at the sealed config.
func (o *Orchestrator) sealRootfs(ctx context.Context, s *instance) error {
	s.mu.Lock()
	rec := s.rec
	s.mu.Unlock()
	cfg, err := o.sealDisk(ctx, rec, fmt.Sprintf("rootfs-%d", rec.Gen), "sandbox "+rec.ID, keepUpper)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.rec.RootfsImage = cfg
	s.mu.Unlock()
	return nil
}

// sealDisk seals rec's root disk into a layer name of its directory
// (disk.Manager.SealRoot) and returns the config listing its stack now.
func (o *Orchestrator) sealDisk(ctx context.Context, rec Record, name, message string, mode disk.SealMode) (string, error) {
	return o.disks.SealRoot(ctx, rec.held(), rec.RootfsImage, name, message, mode)
}

// copyRootInto puts rec's root disk as it is now into snapshot r's
// directory (shared layers hard-linked) and points r at it.
func (o *Orchestrator) copyRootInto(rec Record, r *snapshot.Record) error {
	cfg, err := o.disks.CopyInto(rec.RootfsImage, rec.Dir, r.Dir)
	if err != nil {
		return err
	}
	r.RootfsImage = cfg
	return nil
}

// held is the record's root disk device as package disk names it.
func (r Record) held() disk.Held {
	return disk.Held{Owner: r.ID, Dir: r.Dir, Device: r.Device, Has: r.HasDevice}
}

// sealDevice seals rec's root disk device (disk.Manager.Seal).
func sealDevice(ctx context.Context, disks *disk.Manager, rec Record, name, message string, mode disk.SealMode) (string, error) {
	return disks.Seal(ctx, rec.held(), name, message, mode)
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

// settleDisks waits until the layers of rec's root disk and drives are
// files here (disk.Settle).
func (o *Orchestrator) settleDisks(ctx context.Context, rec Record) error {
	cfgs := []string{rec.RootfsImage}
	for _, d := range rec.Drives {
		cfgs = append(cfgs, d.Config)
	}
	return o.disks.Settle(ctx, cfgs...)
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
