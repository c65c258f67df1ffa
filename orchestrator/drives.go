package orchestrator

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot"
)

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
