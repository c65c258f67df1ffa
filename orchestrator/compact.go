package orchestrator

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot"
)

// Every pause adds a memory layer and a rootfs layer to a sandbox (and one
// to each writable extra drive). Reads
// cost more the deeper a stack gets (and an LSMT stack holds at most 255
// layers), so once a paused sandbox's memory or rootfs chain is deeper than
// Options.MaxLayers, a background job merges the layers the sandbox owns
// (those in its directory; shared template and snapshot layers stay) into
// one: the memory's by package memimage, the disks' here.

func (o *Orchestrator) maxLayers() int { return o.mem.MaxLayers() }

// maybeCompact starts a merge in the background when a paused sandbox's
// chains are too deep.
func (o *Orchestrator) maybeCompact(rec sandbox.Record) {
	if !o.mem.Deep(rec.Snapshot) && len(snapshot.Refs(rec.RootfsImage)) <= o.maxLayers() && len(o.deepDrives(rec)) == 0 {
		return
	}
	o.goBackground(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		if err := o.compact(ctx, rec.ID); err != nil {
			o.log.Warn("compact sandbox layers", "sandbox", rec.ID, "err", err)
		}
	})
}

// compact merges the sandbox's own memory and rootfs layers while it is
// paused (the operation lock keeps resume out meanwhile).
func (o *Orchestrator) compact(ctx context.Context, id string) error {
	s, err := o.lockOp(id)
	if err != nil {
		return err
	}
	defer s.op.Unlock()
	s.mu.Lock()
	rec := s.rec
	s.mu.Unlock()
	if rec.State != sandbox.Paused {
		return nil
	}
	start := time.Now()
	obsolete, err := o.mem.Compact(ctx, rec.Snapshot, rec.Dir, rec.Gen)
	if err != nil {
		return err
	}
	if layers := snapshot.Refs(rec.RootfsImage); len(layers) > o.maxLayers() {
		merged, old, err := snapshot.MergeOwned(ctx, layers, rec.Dir, fmt.Sprintf("rootfs-%d-merged.lsmt", rec.Gen), snapshot.MergeLayers)
		if err != nil {
			return fmt.Errorf("rootfs: %w", err)
		}
		cfg := filepath.Join(rec.Dir, fmt.Sprintf("rootfs-%d-merged.json", rec.Gen))
		if err := snapshot.WriteImageConfig(cfg, merged); err != nil {
			return err
		}
		if err := fpCompactRootfs.Inject(); err != nil {
			return err
		}
		if err := o.update(s, func(r *sandbox.Record) { r.RootfsImage = cfg }); err != nil {
			return err
		}
		obsolete = append(obsolete, old...)
	}
	old, err := o.compactDrives(ctx, s, rec)
	if err != nil {
		return err
	}
	obsolete = append(obsolete, old...)
	// Only now that the new manifests are in place are the merged-away
	// layers unused (snapshots hold their own hard links).
	for _, p := range obsolete {
		_ = os.Remove(p)
	}
	o.log.Info("sandbox layers merged", "sandbox", id, "layers", len(obsolete), "took", time.Since(start).Round(time.Millisecond))
	return nil
}
