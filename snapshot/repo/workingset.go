package repo

import (
	"bytes"
	"context"
	"fmt"
	"strings"

	"github.com/agentenv/agentenv/storage/blob"
)

// Working-set hints: the blocks a restore from a layer read first, in order
// (blob.Cache with Record), kept under hints/workingset/<layer hex> so that
// the next restore, on any node, prefetches them (blob.Cache.Prefetch). A
// hint is mutable and untrusted: a wrong one costs bandwidth, never
// correctness, since every prefetched block is verified like any other.
const hintPrefix = "hints/workingset/"

// Memory working sets were kept under hints/memory/<top layer hex> by
// earlier versions (a manifest commits its stack's pack now,
// Manifest.WorkingSet): GC still sweeps those of layers that are gone.
const memoryHintPrefix = "hints/memory/"

// WorkingSets is implemented by Repo.
type WorkingSets interface {
	PutWorkingSet(ctx context.Context, l Layer, blockSize int64, blocks []int64) error
	WorkingSet(ctx context.Context, l Layer, blockSize int64) ([]int64, error)
}

func hintKey(d Digest) string { return hintPrefix + d.Hex() }

// nblocks is the number of blocks of blockSize in layer l.
func nblocks(l Layer, blockSize int64) int64 { return (l.Size + blockSize - 1) / blockSize }

// PutWorkingSet records blocks (read in blocks of blockSize) as l's hint,
// replacing an older one.
func (r *Repo) PutWorkingSet(ctx context.Context, l Layer, blockSize int64, blocks []int64) error {
	if err := l.Digest.Validate(); err != nil || blockSize <= 0 {
		return fmt.Errorf("put working set: layer %s, block size %d: %w", l.Digest, blockSize, ErrInvalid)
	}
	data := blob.EncodeWorkingSet(blockSize, blocks)
	if _, err := blob.ParseWorkingSet(data, blockSize, nblocks(l, blockSize)); err != nil {
		return fmt.Errorf("put working set of layer %s: %w: %w", l.Digest, ErrInvalid, err)
	}
	if err := r.b.Put(ctx, hintKey(l.Digest), bytes.NewReader(data), int64(len(data)), nil); err != nil {
		return fmt.Errorf("put working set of layer %s in %s: %w", l.Digest, r.b, err)
	}
	return nil
}

// WorkingSet reads l's hint (ErrNotFound when none was recorded).
func (r *Repo) WorkingSet(ctx context.Context, l Layer, blockSize int64) ([]int64, error) {
	if err := l.Digest.Validate(); err != nil || blockSize <= 0 {
		return nil, fmt.Errorf("read working set: layer %s, block size %d: %w", l.Digest, blockSize, ErrInvalid)
	}
	n := nblocks(l, blockSize)
	data, err := r.readSmall(ctx, hintKey(l.Digest), 16+10*n)
	if err != nil {
		return nil, fmt.Errorf("read working set of layer %s from %s: %w", l.Digest, r.b, err)
	}
	blocks, err := blob.ParseWorkingSet(data, blockSize, n)
	if err != nil {
		return nil, fmt.Errorf("read working set of layer %s from %s: %w: %w", l.Digest, r.b, ErrInvalid, err)
	}
	return blocks, nil
}

// sweepHints removes the hints of layers that are gone.
func (r *Repo) sweepHints(ctx context.Context, present map[Digest]bool, dry bool) error {
	for _, prefix := range []string{hintPrefix, memoryHintPrefix} {
		if err := r.sweepHintsUnder(ctx, prefix, present, dry); err != nil {
			return err
		}
	}
	return nil
}

// sweepHintsUnder removes the hints under prefix of layers that are gone.
func (r *Repo) sweepHintsUnder(ctx context.Context, prefix string, present map[Digest]bool, dry bool) error {
	hints, err := r.b.List(ctx, prefix)
	if err != nil {
		return fmt.Errorf("list working sets: %w", err)
	}
	for _, o := range hints {
		d := Digest("sha256:" + strings.TrimPrefix(o.Key, prefix))
		if present[d] || dry {
			continue
		}
		if err := r.b.Delete(ctx, o.Key); err != nil {
			return fmt.Errorf("delete working set %s: %w", o.Key, err)
		}
	}
	return nil
}
