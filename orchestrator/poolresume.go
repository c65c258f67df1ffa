package orchestrator

import (
	"context"
	"errors"

	"github.com/agentenv/agentenv/disk"
	"github.com/agentenv/agentenv/warmpool"
)

// A resume or a fork's child served from the warm pool. A pool entry's VMM
// maps its template's memory file and reaches a disk on the template's
// layers; a paused sandbox of that template, or a snapshot of one, restores
// the same memory file with its own pages written in (restoreMemory's
// overlay, until its memory is flattened into a file of its own) and needs
// a disk on its own sealed layers. So such a start takes an entry of that
// template when the memory fits, and has the storage daemon move the
// entry's disk, which nothing wrote yet, onto its layers
// (disk.Manager.Rebase), before the claim of a pooled create (pool.go) names
// the entry's VMM and device in its record:
//
//  1. the entry's device reads as the sandbox's disk
//     (orchestrator/poolresume/rebased); the entry's record still owns it
//  2. claim, assign, hand over and load as a pooled create
//     (orchestrator/pool/claimed, orchestrator/pool/assigned,
//     warmpool/handed), then the start's own points
//
// A crash before 2 leaves the entry's record, whose removal deletes the
// device and stops the VMM, and a "resuming" (or "starting") record naming
// neither, which recovery puts back to paused (or drops). After 2 a
// "resuming" record names the VMM with PoolClaim set until it has loaded
// the sandbox's state: recovery stops that VMM and deletes the device
// instead of adopting and pausing a VM that never ran the sandbox.

// errNoPooledDisk: an entry without a storage daemon device cannot move.
var errNoPooledDisk = errors.New("the pool entry holds no storage daemon device")

// takeRebased takes a ready entry for the sandbox s restored from vmDir (a
// pause's or a snapshot's) and moves the entry's disk onto the sandbox's
// (step 1 above). Nil when none fits, none is ready, or the move failed
// (the entry is then drained).
func (o *Orchestrator) takeRebased(ctx context.Context, s *instance, vmDir string) *warmpool.Entry {
	s.mu.Lock()
	rec := s.rec
	s.mu.Unlock()
	if o.pool == nil || o.memDev != nil || vmDir == "" || len(rec.Drives) > 0 || rec.ColdBoot || !disk.LocalDisk(rec.RootfsImage) {
		return nil
	}
	t, ok := o.catalog.PooledBase(vmDir, &o.matMu)
	if !ok || t.VCPUs != rec.VCPUs || t.MemoryMiB != rec.MemoryMiB {
		return nil
	}
	e := o.pool.Take(t.ID)
	if e == nil {
		return nil
	}
	var err error = errNoPooledDisk
	if e.HasDevice {
		err = o.disks.Rebase(ctx, e.Device, rec.RootfsImage)
	}
	if err == nil {
		err = fpPoolRebased.Inject()
	}
	if err != nil {
		o.log.Warn("a pooled VM's disk did not move onto the sandbox's; it restores a VM of its own",
			"sandbox", rec.ID, "entry", e.ID, "err", err)
		o.pool.Discard(ctx, e)
		o.pool.Done(e)
		return nil
	}
	o.log.Info("a pooled VM's disk moved onto the sandbox's", "sandbox", rec.ID, "entry", e.ID, "device", e.Device, "template", t.ID)
	return e
}
