package daemon

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/agentenv/agentenv/storage/daemon/rpc"
)

// acquire returns the shared read-only device of an image, creating it on
// first use, and records the holder (idempotently).
func (d *Daemon) acquire(ctx context.Context, p rpc.AcquireParams) (rpc.Device, error) {
	img, err := absImage(p.Image)
	if err != nil {
		return rpc.Device{}, err
	}
	if p.Holder == "" {
		return rpc.Device{}, errf(rpc.CodeInvalid, "holder is required")
	}
	d.sharedMu.Lock()
	defer d.sharedMu.Unlock()
	d.mu.Lock()
	id, ok := d.shared[img]
	d.mu.Unlock()
	if ok {
		if dv, err := d.reuseShared(id, p.Holder); err == nil || !errors.Is(err, errStaleShared) {
			return dv, err
		}
		// The existing export serves an older version of the image (or is
		// lost): its holders keep it, new holders get a fresh export.
	}
	block, err := checkBlock(p.Block, p.Kernel)
	if err != nil {
		return rpc.Device{}, err
	}
	if err := d.checkSharedKind(block); err != nil {
		return rpc.Device{}, err
	}
	dv, err := d.newDevice(ctx, newSpec{kind: rpc.KindShared, image: img, holder: p.Holder, block: block})
	if err != nil {
		return rpc.Device{}, err
	}
	return dv.info(d), nil
}

var errStaleShared = errors.New("shared device is stale")

// reuseShared adds holder to the shared device id, unless the device no
// longer matches its image (errStaleShared).
func (d *Daemon) reuseShared(id uint32, holder string) (rpc.Device, error) {
	dv, err := d.lockDevice(id)
	if err != nil {
		return rpc.Device{}, errStaleShared
	}
	defer dv.op.Unlock()
	if dv.lost != "" || staleAgainstSource(&dv.rec) != "" {
		return rpc.Device{}, errStaleShared
	}
	if !slices.Contains(dv.rec.Holders, holder) {
		next := dv.rec
		next.Holders = append(slices.Clone(dv.rec.Holders), holder)
		if err := d.save(&next); err != nil {
			return rpc.Device{}, err
		}
		dv.set(func() { dv.rec = next })
		if err := fpSharedAfterRecord.Inject(); err != nil {
			return rpc.Device{}, err
		}
	}
	return dv.info(d), nil
}

// staleAgainstSource says why a never-restacked device (pool or shared) no
// longer matches its source image config, or "".
func staleAgainstSource(r *record) string {
	if why := checkStamps(r.Stamps); why != "" {
		return why
	}
	lowers, err := resolveLowers(r.Image)
	if err != nil {
		return err.Error()
	}
	if !slices.Equal(lowers, r.Layers) {
		return fmt.Sprintf("image config %s now names layers %v, the device was made from %v", r.Image, lowers, r.Layers)
	}
	return ""
}

// release drops a holder; the last one takes the export down.
func (d *Daemon) release(ctx context.Context, p rpc.ReleaseParams) error {
	d.sharedMu.Lock()
	defer d.sharedMu.Unlock()
	dv, err := d.lockDevice(p.ID)
	if err != nil {
		return err
	}
	if dv.rec.Kind != rpc.KindShared {
		dv.op.Unlock()
		return errf(rpc.CodeConflict, "device %d is not shared", p.ID)
	}
	i := slices.Index(dv.rec.Holders, p.Holder)
	if i < 0 {
		dv.op.Unlock()
		return errf(rpc.CodeNotFound, "device %d has no holder %q", p.ID, p.Holder)
	}
	next := dv.rec
	next.Holders = slices.Delete(slices.Clone(dv.rec.Holders), i, i+1)
	if len(next.Holders) > 0 {
		defer dv.op.Unlock()
		if err := d.save(&next); err != nil {
			return err
		}
		dv.set(func() { dv.rec = next })
		return fpSharedAfterRecord.Inject()
	}
	dv.op.Unlock()
	return d.delete(ctx, p.ID, true)
}

func (d *Daemon) warm(p rpc.WarmParams) error {
	img, err := absImage(p.Image)
	if err != nil {
		return err
	}
	if p.Low < 0 || p.High < 0 {
		return errf(rpc.CodeInvalid, "watermarks must be non-negative")
	}
	if _, err := resolveLowers(img); err != nil {
		return imageError(err)
	}
	d.pool.configure(shape{image: img, size: p.Size}, p.Low, p.High, false)
	if err := d.savePool(); err != nil {
		return err
	}
	if err := fpWarmAfterSave.Inject(); err != nil {
		return err
	}
	d.pool.refill(shape{image: img, size: p.Size})
	return nil
}
