package volume

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/agentenv/agentenv/snapshot"
)

// MaxLayers is the chain depth above which a volume that no sandbox mounts
// has its layers merged into one (Compact): every read-write session adds
// a layer or more, and a deep chain slows every read of the disk.
const MaxLayers = 8

// Compact merges the layers of the volume of id into one when the chain is
// deeper than MaxLayers and no sandbox mounts it. The merge runs outside
// the store's lock; a mount that came meanwhile wins: the merged layer is
// dropped and the volume keeps its chain.
func (s *Store) Compact(ctx context.Context, id string) error {
	s.mu.Lock()
	v, ok := s.vols[id]
	if !ok || v.InUse() || len(snapshot.Refs(v.Config)) <= MaxLayers {
		s.mu.Unlock()
		return nil
	}
	cfg, gen := v.Config, v.Gen
	s.mu.Unlock()
	vdir := filepath.Join(s.dir, id)
	layers, err := snapshot.LayersOf(cfg)
	if err != nil {
		return fmt.Errorf("compact volume %s: %w", id, err)
	}
	merged, old, err := snapshot.MergeOwned(ctx, layers, vdir, fmt.Sprintf("merged-%d.lsmt", gen+1), snapshot.MergeLayers)
	if err != nil || len(old) == 0 {
		return err
	}
	out := merged[len(merged)-1]
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok = s.vols[id]
	if !ok || v.InUse() || v.Config != cfg {
		_ = os.Remove(out)
		return nil
	}
	next := *v
	next.Gen++
	next.Config = filepath.Join(vdir, fmt.Sprintf("image-%d.json", next.Gen))
	if err := snapshot.WriteImageConfig(next.Config, merged); err != nil {
		_ = os.Remove(out)
		return fmt.Errorf("compact volume %s: %w", v.Name, err)
	}
	if err := fpCompactMerged.Inject(); err != nil {
		return fmt.Errorf("compact volume %s: %w", v.Name, err)
	}
	if err := s.persist(next); err != nil {
		return fmt.Errorf("compact volume %s: %w", v.Name, err)
	}
	*v = next
	// Nothing names the merged-away layers and the old config any more.
	for _, f := range append(old, cfg) {
		_ = os.Remove(f)
	}
	s.log.Info("volume layers merged", "volume", v.Name, "layers", len(old))
	return nil
}
