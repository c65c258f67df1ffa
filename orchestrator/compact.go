package orchestrator

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/storage/lsmt"
	"github.com/agentenv/agentenv/vmm/memsnap"
)

// Every pause adds a memory layer and a rootfs layer to a sandbox. Reads
// cost more the deeper a stack gets (and an LSMT stack holds at most 255
// layers), so once a paused sandbox's memory or rootfs chain is deeper than
// Options.MaxLayers, a background job merges the layers the sandbox owns
// (those in its directory; shared template and snapshot layers stay) into
// one.

// DefaultMaxLayers is the chain depth above which layers are merged.
const DefaultMaxLayers = 32

func (o *Orchestrator) maxLayers() int {
	if o.cfg.MaxLayers > 0 {
		return o.cfg.MaxLayers
	}
	return DefaultMaxLayers
}

// maybeCompact starts a merge in the background when a paused sandbox's
// chains are too deep.
func (o *Orchestrator) maybeCompact(rec Record) {
	mem, _ := readMemoryManifest(rec.Snapshot)
	if len(mem.Layers) <= o.maxLayers() && len(refs(rec.RootfsImage)) <= o.maxLayers() {
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
	if rec.State != Paused {
		return nil
	}
	start := time.Now()
	var obsolete []string
	if mem, err := readMemoryManifest(rec.Snapshot); err == nil && len(mem.Layers) > o.maxLayers() {
		merged, old, err := mergeOwned(ctx, mem.Layers, rec.Dir, fmt.Sprintf("mem-%d-merged.lsmt", rec.Gen), mergeMemory)
		if err != nil {
			return fmt.Errorf("memory: %w", err)
		}
		mem.Layers = merged
		if err := fpCompactMerged.Inject(); err != nil {
			return err
		}
		if err := writeMemoryManifest(rec.Snapshot, mem); err != nil {
			return err
		}
		obsolete = append(obsolete, old...)
	}
	if layers := refs(rec.RootfsImage); len(layers) > o.maxLayers() {
		merged, old, err := mergeOwned(ctx, layers, rec.Dir, fmt.Sprintf("rootfs-%d-merged.lsmt", rec.Gen), mergeLayers)
		if err != nil {
			return fmt.Errorf("rootfs: %w", err)
		}
		cfg := filepath.Join(rec.Dir, fmt.Sprintf("rootfs-%d-merged.json", rec.Gen))
		if err := imageConfig(cfg, merged); err != nil {
			return err
		}
		if err := o.update(s, func(r *Record) { r.RootfsImage = cfg }); err != nil {
			return err
		}
		obsolete = append(obsolete, old...)
	}
	// Only now that the new manifests are in place are the merged-away
	// layers unused (snapshots hold their own hard links).
	for _, p := range obsolete {
		_ = os.Remove(p)
	}
	o.log.Info("sandbox layers merged", "sandbox", id, "layers", len(obsolete), "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// mergeOwned merges the run of layers at the top of the chain that live in
// dir into dir/name, returning the new chain and the merged-away files.
// Memory layers merge page by page (memsnap.Merge); disk layers sector by
// sector (mergeLayers).
func mergeOwned(ctx context.Context, chain []string, dir, name string,
	merge func(ctx context.Context, layers []string, out, message string) error) (merged, old []string, err error) {
	prefix := filepath.Clean(dir) + string(filepath.Separator)
	first := len(chain)
	for first > 0 && strings.HasPrefix(chain[first-1], prefix) {
		first--
	}
	if len(chain)-first < 2 {
		return chain, nil, nil // nothing of ours to merge
	}
	out := filepath.Join(dir, name)
	if err := merge(ctx, chain[first:], out, fmt.Sprintf("merge of %d layers", len(chain)-first)); err != nil {
		return nil, nil, err
	}
	merged = append(append([]string{}, chain[:first]...), out)
	return merged, chain[first:], nil
}

// mergeLayers writes the sealed layers (bottom first) merged into out,
// atomically.
func mergeLayers(ctx context.Context, paths []string, out, message string) error {
	var layers []*lsmt.Layer
	defer func() {
		for _, l := range layers {
			l.Close()
		}
	}()
	for _, p := range paths {
		l, err := lsmt.OpenLayerFile(p)
		if err != nil {
			return fmt.Errorf("merge: %w", err)
		}
		layers = append(layers, l)
	}
	return atomicfile.Write(out, 0o600, func(w io.Writer) error {
		if _, err := lsmt.Merge(ctx, layers, w, message); err != nil {
			return fmt.Errorf("merge into %s: %w", out, err)
		}
		return nil
	})
}

func mergeMemory(ctx context.Context, layers []string, out, message string) error {
	_, err := memsnap.Merge(ctx, layers, out, message)
	return err
}
