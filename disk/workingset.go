package disk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/vmm/memsnap"
)

// Working sets of shared memory exports. A VM mapping a stack's export
// records, once, the pages of it its guest touched until the agent
// answered (memimage records it; the file cannot hold it next to itself,
// so it is kept in the snapshot directory of the stack's config, which
// outlives the export: snapshot.WorkingSetFile, where a pause's capture
// records its own and an import puts the one the repository's pack
// carries). The next VM of the stack has them pushed into the page cache
// while its VMM restores: on a FUSE export the storage daemon stores them
// (FUSE_NOTIFY_STORE: no FUSE read per fault), from the pack when the
// import kept one (snapshot.WorkingSetPackFile: no read of layers the node
// lacks), else read through the export; on a ublk device they are read
// ahead (POSIX_FADV_WILLNEED).

// WorkingSetPath is where the working set of the export file (a VM's
// memory File) is kept.
func (d *MemoryDevices) WorkingSetPath(ctx context.Context, file string) (string, error) {
	dev, err := d.exportOf(ctx, file)
	if err != nil {
		return "", err
	}
	return workingSetOf(dev), nil
}

// workingSetOf is where the working set of shared device dev is kept.
func workingSetOf(dev rpc.Device) string {
	return filepath.Join(filepath.Dir(dev.Image), snapshot.WorkingSetFile)
}

// Remote reports whether the stack exported as file reads layers this
// node lacks (an import's, read lazily until its background fetch ends):
// its working set is worth pushing whatever the node's prefetch setting,
// each of its guest's faults being a fetch.
func (d *MemoryDevices) Remote(ctx context.Context, file string) bool {
	dev, err := d.exportOf(ctx, file)
	return err == nil && IsRemote(dev.Image)
}

// packOf is where the working-set pack of shared device dev is kept (an
// import's: snapshot.WorkingSetPackFile).
func packOf(dev rpc.Device) string {
	return filepath.Join(filepath.Dir(dev.Image), snapshot.WorkingSetPackFile)
}

// Prefetch pushes the recorded working set of the export file into the
// page cache and returns the bytes pushed (memsnap.ErrNoWorkingSet when
// none is recorded). A FUSE export with a working-set pack has the pack's
// bytes stored, without reads of its layers; should that fail, the
// working set is read through the export.
func (d *MemoryDevices) Prefetch(ctx context.Context, file string) (int64, error) {
	dev, err := d.exportOf(ctx, file)
	if err != nil {
		return 0, fmt.Errorf("prefetch %s: %w", file, err)
	}
	var packErr error
	if pack := packOf(dev); d.kind == rpc.BlockFUSE && fileExists(pack) {
		r, err := d.sd.Prefetch(ctx, rpc.PrefetchParams{ID: dev.ID, Pack: pack})
		if err == nil {
			return r.Stored, nil
		}
		packErr = fmt.Errorf("prefetch %s from %s: %w", file, pack, err)
	}
	n, err := d.prefetchRanges(ctx, file, dev)
	return n, errors.Join(packErr, err)
}

// prefetchRanges pushes the working set of the export file (device dev)
// read through it: the storage daemon stores the ranges it reads (FUSE),
// or the kernel reads them ahead (a block device).
func (d *MemoryDevices) prefetchRanges(ctx context.Context, file string, dev rpc.Device) (int64, error) {
	size, err := memsnap.SizeOf(file) // a ublk device's stat says 0
	if err != nil {
		return 0, fmt.Errorf("prefetch %s: %w", file, err)
	}
	extents, err := memsnap.ReadWorkingSet(workingSetOf(dev), size)
	if err != nil {
		return 0, err
	}
	if d.kind != rpc.BlockFUSE {
		return readAhead(file, extents)
	}
	var total int64
	for len(extents) > 0 {
		n := min(len(extents), rpc.MaxPrefetchRanges)
		ranges := make([]rpc.ByteRange, n)
		for i, x := range extents[:n] {
			ranges[i] = rpc.ByteRange{Off: x.Off, Len: x.Len}
		}
		r, err := d.sd.Prefetch(ctx, rpc.PrefetchParams{ID: dev.ID, Ranges: ranges})
		total += r.Stored
		if err != nil {
			return total, fmt.Errorf("prefetch %s (device %d): %w", file, dev.ID, err)
		}
		extents = extents[n:]
	}
	return total, nil
}

// readAhead queues reads of extents of file (a block device).
func readAhead(file string, extents []memsnap.Extent) (int64, error) {
	f, err := os.Open(file)
	if err != nil {
		return 0, fmt.Errorf("prefetch %s: %w", file, err)
	}
	defer f.Close()
	return memsnap.ReadAhead(f, extents)
}
