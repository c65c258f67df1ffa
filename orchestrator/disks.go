package orchestrator

import (
	"context"

	"github.com/agentenv/agentenv/disk"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/store"
)

// The node's disks live on the storage daemon (package disk, chosen once in
// New): a template's rootfs is a stack of sealed layers; each VM gets an
// export of those layers plus a fresh writable upper; a seal restacks the
// upper into a new layer and the sandbox's image config lists it on top.
// What follows ties them to sandbox records.

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
