package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/lsmt"
	"github.com/agentenv/agentenv/storage/nbd"
	"github.com/agentenv/agentenv/storage/ublk"
	"github.com/agentenv/agentenv/storage/zfile"
)

// A create runs these steps (each followed by its failpoint):
//
//  1. allocate an id, make STATE/devices/ID (after-dir)
//  2. write generation 0: upper files fsynced, image.0.json atomically (after-config)
//  3. open the image and export it (after-export)
//  4. save device.json: the commit point (after-record)
//
// A directory without device.json is garbage a restarted daemon removes
// (nothing was ever answered from it); an export dies with the process and
// its socket is swept at startup. A crash after step 4 leaves a device the
// caller never heard of: it carries the caller's owner, and Reclaim(owner,
// keep...) removes it.

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

// imageError classifies a failure to read a source image config: a
// missing or malformed config is the caller's mistake; anything else (EIO,
// permissions) is ours.
func imageError(err error) error {
	var pe *fs.PathError
	if errors.Is(err, fs.ErrNotExist) || !errors.As(err, &pe) {
		return errf(rpc.CodeInvalid, "%v", err)
	}
	return fmt.Errorf("read image: %w", err)
}

// layerError classifies a failure to open the request's layers: a file
// that is not a valid layer is the request's fault (invalid); anything
// else, an I/O error or a failed export, is internal.
func layerError(err error) error {
	if errors.Is(err, lsmt.ErrFormat) || errors.Is(err, zfile.ErrFormat) || errors.Is(err, zfile.ErrChecksum) {
		return errf(rpc.CodeInvalid, "%v", err)
	}
	return err
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
	block, err := checkBlock(p.Block, p.Kernel)
	if err != nil {
		return rpc.Device{}, err
	}
	if block == rpc.BlockFUSE {
		return rpc.Device{}, errf(rpc.CodeInvalid, "block %q is for shared read-only devices (acquire)", block)
	}
	if as := p.ConnectAs; as != nil && (as.UID == ^uint32(0) || as.GID == ^uint32(0)) {
		return rpc.Device{}, errf(rpc.CodeInvalid, "connect_as %d:%d: -1 is no identity", as.UID, as.GID)
	}
	if !p.ReadOnly && !p.TCP && block == rpc.BlockNone {
		sh := shape{image: img, size: p.Size}
		if dv, ok := d.takeWarm(sh, p.Owner, p.ConnectAs); ok {
			d.pool.refill(sh)
			return dv, nil
		}
		defer d.pool.touch(sh)
	}
	dv, err := d.newDevice(ctx, newSpec{kind: rpc.KindRuntime, image: img, size: p.Size, readOnly: p.ReadOnly, owner: p.Owner, tcp: p.TCP, block: block, connectAs: p.ConnectAs})
	if err != nil {
		return rpc.Device{}, err
	}
	return dv.info(d), nil
}

// takeWarm turns a ready pool device of the shape into the caller's runtime
// device: one record save.
func (d *Daemon) takeWarm(sh shape, owner string, as *rpc.Identity) (rpc.Device, bool) {
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
		if err := dv.ownSocket(as); err != nil {
			dv.op.Unlock()
			d.log.Error("warm pool: hand the socket to its VMM", "device", id, "err", err)
			d.delete(context.Background(), id, false)
			continue
		}
		next := dv.rec
		next.Kind, next.Owner, next.ConnectAs = rpc.KindRuntime, owner, as
		if err := d.save(&next); err != nil {
			dv.op.Unlock()
			d.log.Error("warm pool: claim device", "device", id, "err", err)
			continue
		}
		dv.set(func() { dv.rec = next })
		fpPoolAfterClaim.Inject()
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
	block    string // kernel block device kind
	holder   string
	// connectAs owns the export socket (rpc.CreateParams.ConnectAs).
	connectAs *rpc.Identity
}

// newDevice materialises a device in the state directory and exports it.
func (d *Daemon) newDevice(ctx context.Context, s newSpec) (*device, error) {
	lowers, err := resolveLowers(s.image)
	if err != nil {
		return nil, imageError(err)
	}
	stamped := lowers
	if s.kind == rpc.KindShared {
		stamped = append([]string{s.image}, lowers...) // the export serves the config itself
	}
	stamps, err := stampFiles(stamped...)
	if err != nil {
		return nil, imageError(err)
	}
	id, ok := d.ids.alloc()
	if !ok {
		return nil, errf(rpc.CodeCapacity, "all %d device ids are in use", d.opts.MaxDevices)
	}
	dir := d.deviceDir(id)
	dv := &device{rec: record{
		ID: id, Kind: s.kind, Owner: s.owner, Image: s.image, Config: s.image, ReadOnly: s.readOnly || s.kind == rpc.KindShared,
		Size: s.size, ReqSize: s.size, TCP: s.tcp, Block: s.block, Export: fmt.Sprintf("%s%d-%s", rpc.ExportPrefix, id, nonce()),
		ConnectAs: s.connectAs, Layers: lowers, Stamps: stamps, Created: time.Now().UTC(),
	}}
	if s.holder != "" {
		dv.rec.Holders = []string{s.holder}
	}
	if err := d.materialise(ctx, dv, dir, s); err != nil {
		dv.stop()
		d.discard(dir)
		os.Remove(d.socketPath(id))
		d.ids.free(id)
		return nil, fmt.Errorf("create device %d: %w", id, err)
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

// materialise runs steps 1-4 of a create (see above).
func (d *Daemon) materialise(ctx context.Context, dv *device, dir string, s newSpec) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	if err := atomicfile.SyncDir(filepath.Dir(dir)); err != nil {
		return err
	}
	if err := fpCreateAfterDir.Inject(); err != nil {
		return err
	}
	if s.kind != rpc.KindShared {
		cfg, err := writeGeneration(ctx, dir, 0, dv.rec.Layers, s.size, s.readOnly)
		if err != nil {
			return layerError(err)
		}
		dv.rec.Config = cfg
	}
	if err := fpCreateAfterConfig.Inject(); err != nil {
		return err
	}
	if err := d.start(dv); err != nil {
		return layerError(err)
	}
	if err := fpCreateAfterExport.Inject(); err != nil {
		return err
	}
	if err := d.save(&dv.rec); err != nil {
		return err
	}
	return fpCreateAfterRecord.Inject()
}

// checkBlock resolves the kernel block device a request asks for and
// refuses, as invalid, a kind this host's kernel cannot provide.
func checkBlock(block string, kernel bool) (string, error) {
	kind, err := rpc.BlockKind(block, kernel)
	if err != nil {
		return "", errf(rpc.CodeInvalid, "%v", err)
	}
	switch kind {
	case rpc.BlockNBD:
		if err := nbd.KernelAvailable(); err != nil {
			return "", errf(rpc.CodeInvalid, "kernel attach: %v", err)
		}
	case rpc.BlockUblk:
		if err := ublk.Available(); err != nil {
			return "", errf(rpc.CodeInvalid, "ublk export: %v", err)
		}
	}
	return kind, nil
}
