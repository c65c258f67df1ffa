package snapshot

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/storage/blob"
	"github.com/agentenv/agentenv/storage/image"
	"github.com/agentenv/agentenv/storage/lsmt"
	"github.com/agentenv/agentenv/vmm/memsnap"
)

// The layer files of root disks and memory images: the image configs that
// list a disk's layers, adoption of sealed layers into a new owner's
// directory, and merges of a chain's top layers.

// WriteImageConfig writes an image config listing layers (absolute paths
// or URLs, bottom first) at path, atomically.
func WriteImageConfig(path string, layers []string) error {
	cfg := image.Config{}
	for _, l := range layers {
		if blob.IsURL(l) {
			// A layer the node reads through its layer socket until it is
			// fetched (a lazy restore): the storage daemon lists it by URL.
			cfg.Lowers = append(cfg.Lowers, image.LayerRef{URL: l})
			continue
		}
		cfg.Lowers = append(cfg.Lowers, image.LayerRef{File: l})
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("write image config %s: %w", path, err)
	}
	return nil
}

// LayersOf reads the lowers of an image config as absolute paths.
func LayersOf(path string) ([]string, error) {
	cfg, err := image.LoadConfig(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range cfg.Lowers {
		if l.File == "" {
			return nil, fmt.Errorf("image config %s: layer %+v is not a local file", path, l)
		}
		p := l.File
		if !filepath.IsAbs(p) {
			p = filepath.Join(filepath.Dir(path), p)
		}
		out = append(out, p)
	}
	return out, nil
}

// Refs lists the layer files of an image config (none when it is empty or
// unreadable: for in-use checks, which must not fail on a broken record).
func Refs(imageConfig string) []string {
	if imageConfig == "" {
		return nil
	}
	l, _ := LayersOf(imageConfig)
	return l
}

// AdoptLayers hard-links the layers that live under owner into dir (sealed
// layers never change, so a link is a copy that costs nothing and survives
// the owner's removal) and returns the list with those paths replaced.
func AdoptLayers(layers []string, owner, dir string) ([]string, error) {
	out := make([]string, len(layers))
	prefix := filepath.Clean(owner) + string(filepath.Separator)
	for i, l := range layers {
		out[i] = l
		if !strings.HasPrefix(l, prefix) {
			continue
		}
		dst := filepath.Join(dir, filepath.Base(l))
		if err := LinkOrCopy(l, dst); err != nil {
			return nil, err
		}
		out[i] = dst
	}
	return out, nil
}

// LinkTree hard-links every regular file of src into dst (created), but
// files atomicfile is still writing.
func LinkTree(src, dst string) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || atomicfile.IsTemp(e.Name()) {
			continue
		}
		if err := LinkOrCopy(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// LinkOrCopy hard-links src to dst, or copies it sparsely across filesystems.
func LinkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	return SparseCopy(context.Background(), src, dst)
}

// SparseCopy copies src to dst keeping holes (and sharing extents where the
// filesystem can): disks and memory images are mostly holes.
func SparseCopy(ctx context.Context, src, dst string) error {
	out, err := exec.CommandContext(ctx, "cp", "--sparse=always", "--reflink=auto", src, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("copy %s to %s: %w: %s", src, dst, err, out)
	}
	// cp gives a new file the source's mode; a copy is node state, private.
	if err := os.Chmod(dst, 0o600); err != nil {
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	return nil
}

// MergeFunc writes sealed layers (bottom first) merged into out.
type MergeFunc func(ctx context.Context, layers []string, out, message string) error

// MergeOwned merges the run of layers at the top of the chain that live in
// dir into dir/name, returning the new chain and the merged-away files.
// Memory layers merge page by page (MergeMemory); disk layers sector by
// sector (MergeLayers).
func MergeOwned(ctx context.Context, chain []string, dir, name string, merge MergeFunc) (merged, old []string, err error) {
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

// MergeLayers writes the sealed disk layers (bottom first) merged into out,
// atomically.
func MergeLayers(ctx context.Context, paths []string, out, message string) error {
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

// MergeMemory writes sealed memory layers (bottom first) merged into out.
func MergeMemory(ctx context.Context, layers []string, out, message string) error {
	_, err := memsnap.Merge(ctx, layers, out, message)
	return err
}
