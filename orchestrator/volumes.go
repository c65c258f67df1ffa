package orchestrator

import (
	"context"

	"github.com/agentenv/agentenv/volume"
)

// Volumes on sandboxes: the store is package volume's, the drives and the
// commit of a killed sandbox's writes package disk's (disk/volumes.go),
// the guest's mounts package sandbox's (sandbox/volumes.go).

// VolumeMount is a create's volume: mounted at Path in the guest.
type VolumeMount = volume.Mount

// Volumes is the node's volume store.
func (o *Orchestrator) Volumes() *volume.Store { return o.volumes }

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
