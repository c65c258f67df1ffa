package daemon

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/image"
	"github.com/agentenv/agentenv/storage/nbd"
)

func nonce() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func absImage(p string) (string, error) {
	if p == "" {
		return "", errf(rpc.CodeInvalid, "image config path is required")
	}
	a, err := filepath.Abs(p)
	if err != nil {
		return "", errf(rpc.CodeInvalid, "image %s: %v", p, err)
	}
	return a, nil
}

// lockDevice returns the device with its op lock held, or an error if it is
// gone (including deleted while we waited for the lock).
func (d *Daemon) lockDevice(id uint32) (*device, error) {
	dv, err := d.lookup(id)
	if err != nil {
		return nil, err
	}
	dv.op.Lock()
	if dv.deleted {
		dv.op.Unlock()
		return nil, errf(rpc.CodeNotFound, "device %d", id)
	}
	return dv, nil
}

func (d *Daemon) create(ctx context.Context, p rpc.CreateParams) (rpc.Device, error) {
	img, err := absImage(p.Image)
	if err != nil {
		return rpc.Device{}, err
	}
	if p.Size < 0 || p.Size%512 != 0 {
		return rpc.Device{}, errf(rpc.CodeInvalid, "size %d must be a non-negative multiple of 512", p.Size)
	}
	if p.Kernel {
		if err := nbd.KernelAvailable(); err != nil {
			return rpc.Device{}, errf(rpc.CodeInvalid, "kernel attach: %v", err)
		}
	}
	if !p.ReadOnly && !p.TCP && !p.Kernel {
		sh := shape{image: img, size: p.Size}
		if dv, ok := d.takeWarm(sh, p.Owner); ok {
			d.pool.refill(sh)
			return dv, nil
		}
		defer d.pool.touch(sh)
	}
	dv, err := d.newDevice(ctx, newSpec{kind: rpc.KindRuntime, image: img, size: p.Size, readOnly: p.ReadOnly, owner: p.Owner, tcp: p.TCP, kernel: p.Kernel})
	if err != nil {
		return rpc.Device{}, err
	}
	return dv.info(d), nil
}

// takeWarm turns a ready pool device of the shape into the caller's runtime device.
func (d *Daemon) takeWarm(sh shape, owner string) (rpc.Device, bool) {
	for {
		id, ok := d.pool.take(sh)
		if !ok {
			return rpc.Device{}, false
		}
		dv, err := d.lockDevice(id)
		if err != nil {
			continue
		}
		if why := staleAgainstSource(&dv.rec); why != "" {
			// Made before the image config changed: never hand it out.
			dv.op.Unlock()
			d.log.Info("warm pool: dropping stale device", "device", id, "reason", why)
			d.delete(context.Background(), id, false)
			continue
		}
		dv.rec.Kind, dv.rec.Owner = rpc.KindRuntime, owner
		if err := d.save(&dv.rec); err != nil {
			dv.rec.Kind, dv.rec.Owner = rpc.KindPool, ""
			dv.op.Unlock()
			d.log.Error("warm pool: claim device", "device", id, "err", err)
			continue
		}
		info := dv.info(d)
		dv.op.Unlock()
		return info, true
	}
}

type newSpec struct {
	kind     string
	image    string
	size     int64
	readOnly bool
	owner    string
	tcp      bool
	kernel   bool
	holder   string
}

// newDevice materialises a device in the state directory and exports it.
func (d *Daemon) newDevice(ctx context.Context, s newSpec) (*device, error) {
	lowers, err := resolveLowers(s.image)
	if err != nil {
		return nil, errf(rpc.CodeInvalid, "%v", err)
	}
	stamped := lowers
	if s.kind == rpc.KindShared {
		stamped = append([]string{s.image}, lowers...) // the export serves the config itself
	}
	stamps, err := stampFiles(stamped...)
	if err != nil {
		return nil, errf(rpc.CodeInvalid, "%v", err)
	}
	id, ok := d.ids.alloc()
	if !ok {
		return nil, errf(rpc.CodeConflict, "all %d device ids are in use", d.opts.MaxDevices)
	}
	dir := d.deviceDir(id)
	dv := &device{rec: record{
		ID: id, Kind: s.kind, Owner: s.owner, Image: s.image, Config: s.image, ReadOnly: s.readOnly || s.kind == rpc.KindShared,
		Size: s.size, ReqSize: s.size, TCP: s.tcp, Kernel: s.kernel, Export: fmt.Sprintf("aenv-%d-%s", id, nonce()),
		Layers: lowers, Stamps: stamps, Created: time.Now().UTC(),
	}}
	if s.holder != "" {
		dv.rec.Holders = []string{s.holder}
	}
	fail := func(err error) (*device, error) {
		dv.stop()
		os.RemoveAll(dir)
		d.ids.free(id)
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fail(fmt.Errorf("create device %d: %w", id, err))
	}
	if s.kind != rpc.KindShared {
		dv.rec.Config = filepath.Join(dir, "image.0.json")
		spec := image.CreateSpec{Lowers: lowers, Size: s.size, UpperData: "upper.0.data", UpperIndex: "upper.0.index", NoUpper: s.readOnly}
		if _, err := image.Create(ctx, dv.rec.Config, spec); err != nil {
			return fail(errf(rpc.CodeInvalid, "create device %d: %v", id, err))
		}
	}
	if err := d.start(dv); err != nil {
		return fail(errf(rpc.CodeInvalid, "%v", err))
	}
	if err := d.save(&dv.rec); err != nil {
		return fail(err)
	}
	d.mu.Lock()
	d.devices[id] = dv
	if s.kind == rpc.KindShared {
		d.shared[s.image] = id
	}
	d.mu.Unlock()
	d.log.Info("device created", "device", id, "kind", s.kind, "image", s.image, "socket", d.socketPath(id))
	return dv, nil
}

// delete stops a device's export and removes its state. Shared devices go
// only through release (internal), so a stray delete cannot pull a memory
// image from under running VMs.
func (d *Daemon) delete(_ context.Context, id uint32, internal bool) error {
	dv, err := d.lockDevice(id)
	if err != nil {
		return err
	}
	defer dv.op.Unlock()
	if dv.rec.Kind == rpc.KindShared && !internal && dv.lost == "" {
		return errf(rpc.CodeConflict, "device %d is shared by %v: release it instead", id, dv.rec.Holders)
	}
	if err := dv.stop(); err != nil {
		d.log.Warn("delete: close image", "device", id, "err", err)
	}
	if err := os.RemoveAll(d.deviceDir(id)); err != nil {
		return fmt.Errorf("delete device %d: %w", id, err)
	}
	os.Remove(d.socketPath(id))
	dv.deleted = true
	d.mu.Lock()
	delete(d.devices, id)
	if d.shared[dv.rec.Image] == id && dv.rec.Kind == rpc.KindShared {
		delete(d.shared, dv.rec.Image)
	}
	d.mu.Unlock()
	d.pool.forget(id)
	d.ids.free(id)
	d.log.Info("device deleted", "device", id)
	return nil
}

// restack seals the live upper of a runtime device into a new sealed layer
// and continues the device on a fresh upper stacked on it. NBD clients stay
// connected: I/O pauses for the duration and resumes on the new stack.
func (d *Daemon) restack(ctx context.Context, p rpc.RestackParams) (rpc.RestackResult, error) {
	dv, err := d.lockDevice(p.ID)
	if err != nil {
		return rpc.RestackResult{}, err
	}
	defer dv.op.Unlock()
	switch {
	case dv.lost != "":
		return rpc.RestackResult{}, errf(rpc.CodeLost, "device %d is lost: %s", p.ID, dv.lost)
	case dv.rec.Kind != rpc.KindRuntime || dv.rec.ReadOnly:
		return rpc.RestackResult{}, errf(rpc.CodeInvalid, "device %d is %s/read-only=%v: only writable runtime devices restack", p.ID, dv.rec.Kind, dv.rec.ReadOnly)
	}
	old := dv.rec
	gen := old.Gen + 1
	dir := d.deviceDir(p.ID)
	layer := p.Layer
	if layer == "" {
		layer = filepath.Join(dir, "layers", fmt.Sprintf("layer-%d.lsmt", gen))
	}
	if layer, err = filepath.Abs(layer); err != nil {
		return rpc.RestackResult{}, errf(rpc.CodeInvalid, "layer path: %v", err)
	}
	if err := os.MkdirAll(filepath.Dir(layer), 0o700); err != nil {
		return rpc.RestackResult{}, fmt.Errorf("restack device %d: %w", p.ID, err)
	}

	be := dv.be
	be.mu.Lock() // quiesce: in-flight requests drain, new ones wait
	defer be.mu.Unlock()
	if err := be.im.Flush(); err != nil {
		return rpc.RestackResult{}, fmt.Errorf("restack device %d: flush: %w", p.ID, err)
	}
	info, err := be.im.Commit(ctx, layer, image.CommitOptions{Message: p.Message})
	if err != nil {
		return rpc.RestackResult{}, fmt.Errorf("restack device %d: %w", p.ID, err)
	}
	digest, err := fileDigest(layer)
	if err != nil {
		return rpc.RestackResult{}, fmt.Errorf("restack device %d: %w", p.ID, err)
	}
	next, newIm, err := d.nextGeneration(ctx, old, layer, gen)
	if err != nil {
		return rpc.RestackResult{}, fmt.Errorf("restack device %d: %w", p.ID, err)
	}
	// The record switches to the new config only now; a crash before this
	// line restarts on the old upper, which still holds every write.
	if err := d.save(&next); err != nil {
		newIm.Close()
		return rpc.RestackResult{}, err
	}
	oldIm := be.im
	be.im, dv.rec = newIm, next
	if err := oldIm.Close(); err != nil {
		d.log.Warn("restack: close old image", "device", p.ID, "err", err)
	}
	removeGeneration(dir, old)
	d.log.Info("device restacked", "device", p.ID, "layer", layer, "digest", digest)
	return rpc.RestackResult{Layer: layer, Digest: digest, Size: info.Size, Device: dv.info(d)}, nil
}

// nextGeneration writes the config for generation gen (old layers + layer,
// fresh upper) and opens it.
func (d *Daemon) nextGeneration(ctx context.Context, old record, layer string, gen int) (record, *image.Image, error) {
	st, err := stampFile(layer)
	if err != nil {
		return record{}, nil, err
	}
	next := old
	next.Gen = gen
	next.Layers = append(slices.Clone(old.Layers), layer)
	next.Stamps = append(slices.Clone(old.Stamps), st)
	next.Config = filepath.Join(d.deviceDir(old.ID), fmt.Sprintf("image.%d.json", gen))
	// A restack that died after writing these files (before its record was
	// saved) leaves them behind unused; start clean.
	removeGeneration(d.deviceDir(old.ID), next)
	spec := image.CreateSpec{
		Lowers: next.Layers, Size: old.Size,
		UpperData: fmt.Sprintf("upper.%d.data", gen), UpperIndex: fmt.Sprintf("upper.%d.index", gen),
	}
	if _, err := image.Create(ctx, next.Config, spec); err != nil {
		return record{}, nil, err
	}
	im, err := image.Open(ctx, next.Config, image.Options{})
	if err != nil {
		return record{}, nil, err
	}
	return next, im, nil
}

// removeGeneration deletes the config and upper files of a replaced generation.
func removeGeneration(dir string, r record) {
	os.Remove(r.Config)
	for _, ext := range []string{"data", "index"} {
		os.Remove(filepath.Join(dir, fmt.Sprintf("upper.%d.%s", r.Gen, ext)))
	}
}

func fileDigest(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("digest %s: %w", path, err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

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
	if p.Kernel {
		if err := nbd.KernelAvailable(); err != nil {
			return rpc.Device{}, errf(rpc.CodeInvalid, "kernel attach: %v", err)
		}
	}
	dv, err := d.newDevice(ctx, newSpec{kind: rpc.KindShared, image: img, holder: p.Holder, kernel: p.Kernel})
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
		dv.rec = next
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
		return errf(rpc.CodeInvalid, "device %d is not shared", p.ID)
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
		dv.rec = next
		return nil
	}
	dv.op.Unlock()
	return d.delete(ctx, p.ID, true)
}

// ownedBy says whether a holder name belongs to owner ("owner" or "owner/...").
func ownedBy(holder, owner string) bool {
	return holder == owner || strings.HasPrefix(holder, owner+"/")
}

// reclaim deletes an owner's runtime devices and drops its shared references,
// except for the devices it still uses.
func (d *Daemon) reclaim(ctx context.Context, p rpc.ReclaimParams) (rpc.ReclaimResult, error) {
	if p.Owner == "" {
		return rpc.ReclaimResult{}, errf(rpc.CodeInvalid, "owner is required")
	}
	var res rpc.ReclaimResult
	for _, dev := range d.list().Devices {
		if slices.Contains(p.Keep, dev.ID) {
			continue
		}
		switch {
		case dev.Kind == rpc.KindRuntime && dev.Owner == p.Owner:
			if err := d.delete(ctx, dev.ID, false); err != nil {
				return res, err
			}
			res.Deleted = append(res.Deleted, dev.ID)
		case dev.Kind == rpc.KindShared:
			released := false
			for _, h := range dev.Holders {
				if ownedBy(h, p.Owner) {
					if err := d.release(ctx, rpc.ReleaseParams{ID: dev.ID, Holder: h}); err != nil {
						return res, err
					}
					released = true
				}
			}
			if released {
				res.Released = append(res.Released, dev.ID)
			}
		}
	}
	return res, nil
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
		return errf(rpc.CodeInvalid, "%v", err)
	}
	d.pool.configure(shape{image: img, size: p.Size}, p.Low, p.High)
	return d.savePool()
}
