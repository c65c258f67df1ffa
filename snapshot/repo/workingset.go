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

// Memory working sets: the pages of a memory layer stack a restore touches
// first, by guest address (package memsnap's format, opaque here), kept
// under hints/memory/<top layer hex> by the node that captured the stack's
// top layer, so that a node restoring the stack from layers it lacks has
// them pushed ahead of the guest. A hint too: a wrong one costs bandwidth.
const memoryHintPrefix = "hints/memory/"

// MaxMemoryWorkingSet bounds a memory working set's size.
const MaxMemoryWorkingSet = 16 << 20

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

// PutMemoryWorkingSet records data as the working set of the memory stack
// whose top layer is top, replacing an older one.
func (r *Repo) PutMemoryWorkingSet(ctx context.Context, top Layer, data []byte) error {
	if err := top.Digest.Validate(); err != nil || len(data) == 0 || len(data) > MaxMemoryWorkingSet {
		return fmt.Errorf("put memory working set of layer %s (%d bytes): %w", top.Digest, len(data), ErrInvalid)
	}
	if err := r.b.Put(ctx, memoryHintPrefix+top.Digest.Hex(), bytes.NewReader(data), int64(len(data)), nil); err != nil {
		return fmt.Errorf("put memory working set of layer %s in %s: %w", top.Digest, r.b, err)
	}
	return nil
}

// MemoryWorkingSet reads the working set of the memory stack whose top
// layer is top (ErrNotFound when none was recorded), at most
// MaxMemoryWorkingSet bytes of it.
func (r *Repo) MemoryWorkingSet(ctx context.Context, top Layer) ([]byte, error) {
	if err := top.Digest.Validate(); err != nil {
		return nil, fmt.Errorf("read memory working set of layer %s: %w", top.Digest, ErrInvalid)
	}
	data, err := r.readSmall(ctx, memoryHintPrefix+top.Digest.Hex(), MaxMemoryWorkingSet)
	if err != nil {
		return nil, fmt.Errorf("read memory working set of layer %s from %s: %w", top.Digest, r.b, err)
	}
	return data, nil
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
