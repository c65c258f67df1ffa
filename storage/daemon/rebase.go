package daemon

import (
	"context"
	"fmt"

	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/image"
)

// A rebase moves a runtime device that was never written onto the lowers
// of another image config, under its live export (rpc.RebaseParams): the
// node starts VMMs ahead with a disk on a template's layers and hands one
// to a resume or a fork child, whose disk stacks on other layers. A device
// nothing was written to reads exactly as its lowers, so moving it loses
// nothing; the client connected to its export (a VMM waiting for its
// state) stays connected and reads the new image from then on. Its steps,
// with I/O held off from the check to the swap:
//
//  1. check: a writable runtime device, no kernel block device (the kernel
//     caches blocks of the old image), an upper never written, and an
//     image of the device's size
//  2. write the next generation on the new lowers: a fresh upper and its
//     config image.GEN.json, durable (after-config)
//  3. save device.json naming the new image, config, layers, stamps and
//     generation: the commit point (after-record)
//  4. swap the served image; remove the old generation
//
// Until step 3 the record names the old generation and a restarted daemon
// removes the new one's files (sweepDevice: files no record names); after
// it, the old one's.

// rebase runs a rebase (see above) with the device's op lock held.
func (d *Daemon) rebase(ctx context.Context, p rpc.RebaseParams) (rpc.Device, error) {
	img, err := absImage(p.Image)
	if err != nil {
		return rpc.Device{}, err
	}
	lowers, err := resolveLowers(img)
	if err != nil {
		return rpc.Device{}, imageError(err)
	}
	stamps, err := stampFiles(lowers...)
	if err != nil {
		return rpc.Device{}, imageError(err)
	}
	dv, err := d.lockDevice(p.ID)
	if err != nil {
		return rpc.Device{}, err
	}
	defer dv.op.Unlock()
	if err := checkRebase(dv); err != nil {
		return rpc.Device{}, err
	}
	next := dv.rec
	next.Image, next.Layers, next.Stamps, next.Gen = img, lowers, stamps, dv.rec.Gen+1
	if err := d.rebaseSteps(ctx, dv, next); err != nil {
		return rpc.Device{}, fmt.Errorf("rebase device %d onto %s: %w", p.ID, img, err)
	}
	d.log.Info("device rebased", "device", p.ID, "image", img, "gen", next.Gen)
	return dv.info(d), nil
}

// checkRebase refuses a device a rebase cannot move (step 1, but for
// "never written", which needs I/O held off).
func checkRebase(dv *device) error {
	r := &dv.rec
	switch {
	case dv.lost != "":
		return errf(rpc.CodeLost, "device %d is lost: %s", r.ID, dv.lost)
	case r.Kind != rpc.KindRuntime || r.ReadOnly:
		return errf(rpc.CodeConflict, "device %d is a %s device: only a writable runtime device is rebased", r.ID, r.Kind)
	case r.blockKind() != rpc.BlockNone:
		return errf(rpc.CodeConflict, "device %d is also the kernel's %s block device, whose cache may hold the old image", r.ID, r.blockKind())
	}
	return nil
}

// rebaseSteps runs steps 1-4 with the device's I/O held off.
func (d *Daemon) rebaseSteps(ctx context.Context, dv *device, next record) error {
	be := dv.be
	be.mu.Lock() // no request runs from the check to the swap
	defer be.mu.Unlock()
	if be.im == nil {
		return errNoImage
	}
	if be.im.Written() {
		return errf(rpc.CodeConflict, "device %d was written to: its upper is not the new image's", dv.rec.ID)
	}
	dir := d.deviceDir(dv.rec.ID)
	cfg, err := writeGeneration(ctx, dir, next.Gen, next.Layers, dv.rec.ReqSize, false)
	if err != nil {
		return layerError(err)
	}
	next.Config = cfg
	newIm, err := image.Open(ctx, cfg, d.imageOptions(false))
	if err == nil && newIm.Size() != be.size {
		newIm.Close()
		err = errf(rpc.CodeInvalid, "image %s is %d bytes, the device %d", next.Image, newIm.Size(), be.size)
	}
	if err == nil {
		err = fpRebaseAfterConfig.Inject()
		if err != nil {
			newIm.Close()
		}
	}
	if err != nil {
		_ = removeGeneration(dir, next.Gen)
		return err
	}
	if err := d.save(&next); err != nil {
		// As in a restack: what is on disk says whether it committed.
		if r, lerr := loadRecord(dir); lerr != nil || r.Gen != next.Gen {
			newIm.Close()
			_ = removeGeneration(dir, next.Gen)
			return err
		}
		d.log.Warn("rebase: record saved with an error; continuing on the new image", "device", next.ID, "err", err)
	}
	fpRebaseAfterRecord.Inject() // committed: nothing rolls back
	oldIm, oldGen, oldConfig := be.im, dv.rec.Gen, dv.rec.Config
	be.im = newIm
	dv.set(func() { dv.rec = next })
	if err := oldIm.Close(); err != nil {
		d.log.Warn("rebase: close the old image", "device", next.ID, "err", err)
	}
	if err := removeGeneration(dir, oldGen, oldConfig); err != nil {
		d.log.Warn("rebase: remove the old generation (the next start does)", "device", next.ID, "err", err)
	}
	return nil
}
