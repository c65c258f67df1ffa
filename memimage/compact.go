package memimage

import (
	"context"
	"fmt"

	"github.com/agentenv/agentenv/snapshot"
)

// Every pause adds a memory layer to a sandbox's image. Reads cost more
// the deeper a stack gets (and an LSMT stack holds at most 255 layers), so
// once a paused sandbox's memory chain is deeper than Options.MaxLayers,
// the node merges the layers the sandbox owns (those in its directory;
// shared template and snapshot layers stay) into one, alongside its disks'
// layers.

// DefaultMaxLayers is the chain depth above which layers are merged.
const DefaultMaxLayers = 32

// MaxLayers is the chain depth above which a paused sandbox's own layers
// are merged (memory here; the node applies it to its disks too).
func (im *Images) MaxLayers() int {
	if im.cfg.MaxLayers > 0 {
		return im.cfg.MaxLayers
	}
	return DefaultMaxLayers
}

// Deep reports whether the memory chain of snapshot snapDir is deeper than
// MaxLayers.
func (im *Images) Deep(snapDir string) bool {
	mem, _ := snapshot.ReadMemoryManifest(snapDir)
	return len(mem.Layers) > im.MaxLayers()
}

// Compact (the sandbox paused, its operation held by the caller) merges
// the memory layers of snapshot snapDir that the sandbox owns (in ownDir)
// into one, named for generation gen, when the chain is Deep, and rewrites
// the manifest. It returns the merged-away layers, which the caller
// removes once every manifest naming them is replaced.
func (im *Images) Compact(ctx context.Context, snapDir, ownDir string, gen int) ([]string, error) {
	mem, err := snapshot.ReadMemoryManifest(snapDir)
	if err != nil || len(mem.Layers) <= im.MaxLayers() {
		return nil, nil
	}
	merged, old, err := snapshot.MergeOwned(ctx, mem.Layers, ownDir, fmt.Sprintf("mem-%d-merged.lsmt", gen), snapshot.MergeMemory)
	if err != nil {
		return nil, fmt.Errorf("memory: %w", err)
	}
	if merged[0] != mem.Layers[0] {
		mem.Base = "" // the base file equals the old bottom layer, which is merged away
	}
	mem.Layers = merged
	if err := fpCompactMerged.Inject(); err != nil {
		return nil, err
	}
	if err := snapshot.WriteMemoryManifest(snapDir, mem); err != nil {
		return nil, err
	}
	return old, nil
}
