package orchestrator

import (
	"context"

	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/volume"
)

// Volumes on sandboxes: the store is package volume's, the drives and the
// commit of a killed sandbox's writes package disk's (disk/volumes.go),
// the guest's mounts package sandbox's (sandbox/volumes.go).

// VolumeMount is a create's volume: mounted at Path in the guest.
type VolumeMount = volume.Mount

// Volumes is the node's volume store.
func (o *Orchestrator) Volumes() *volume.Store { return o.volumes }

// mountVolumes (op held, VM running) has the guest mount each volume of s
// at its path.
func (o *Orchestrator) mountVolumes(ctx context.Context, s *instance) error {
	s.mu.Lock()
	rec, slot := s.rec, s.slot()
	s.mu.Unlock()
	return sandbox.MountVolumes(ctx, slot, rec)
}

// freezeVolumes (op held, VM running, about to be killed) has the guest
// flush and freeze its read-write volumes; a failure is logged: the kill
// goes on and the volume keeps what reached the disk, as after a crash.
func (o *Orchestrator) freezeVolumes(ctx context.Context, s *instance) {
	s.mu.Lock()
	rec, slot := s.rec, s.slot()
	s.mu.Unlock()
	if err := sandbox.FreezeVolumes(ctx, slot, rec); err != nil {
		o.log.Warn("the guest did not flush its volumes before the kill; what it had not written is lost as in a crash",
			"sandbox", rec.ID, "err", err)
	}
}

// returnVolumes (op held, VM stopped, devices still there) hands s's
// volumes back to the store (disk.Manager.ReturnVolumes) and merges the
// layers of those committed to in the background.
func (o *Orchestrator) returnVolumes(ctx context.Context, s *instance) {
	s.mu.Lock()
	rec := s.rec
	s.mu.Unlock()
	for _, volID := range o.disks.ReturnVolumes(ctx, o.volumes, rec) {
		o.goBackground(func() {
			if err := o.volumes.Compact(context.WithoutCancel(ctx), volID); err != nil {
				o.log.Warn("merge a volume's layers (the next commit retries)", "volume", volID, "err", err)
			}
		})
	}
}
