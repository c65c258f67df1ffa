package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/storage/daemon/client"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/image"
	"github.com/agentenv/agentenv/vmm"
)

// Root disks come from one of two places:
//
//   - the storage daemon (Options.Storage set): the template's rootfs is a
//     stack of sealed layers; each sandbox gets an NBD export of those
//     layers plus a fresh writable upper; pause seals the upper into a new
//     layer (restack) and the sandbox's image config lists it on top;
//   - plain files (no daemon): a sparse copy of the template's rootfs per
//     sandbox.

// imageConfig writes an image config listing layers (absolute paths,
// bottom first) at path.
func imageConfig(path string, layers []string) error {
	cfg := image.Config{}
	for _, l := range layers {
		cfg.Lowers = append(cfg.Lowers, image.LayerRef{File: l})
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("write image config: %w", err)
	}
	return nil
}

// layersOf reads the lowers of an image config as absolute paths.
func layersOf(path string) ([]string, error) {
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

// warmRootfs asks the storage daemon, once per template image, to keep a
// warm pool of ready root disks of it, so the next creates only take one.
func (o *Orchestrator) warmRootfs(ctx context.Context, t *Template) {
	if o.sd == nil || t.RootfsImage == "" || o.cfg.StoragePoolHigh <= 0 {
		return
	}
	if _, done := o.warmed.LoadOrStore(t.RootfsImage, true); done {
		return
	}
	p := rpc.WarmParams{Image: t.RootfsImage, Low: o.cfg.StoragePoolLow, High: o.cfg.StoragePoolHigh}
	if err := o.sd.Warm(ctx, p); err != nil {
		o.warmed.Delete(t.RootfsImage)
		o.log.Warn("storage warm pool", "template", t.ID, "err", err)
	}
}

// rootfsDrive returns the sandbox's root drive for a (re)start: a new
// daemon device on its image config, or its rootfs file.
func (o *Orchestrator) rootfsDrive(ctx context.Context, s *sandbox) (vmm.Drive, error) {
	if o.sd == nil {
		if _, err := os.Stat(s.rec.Rootfs); err != nil { // first start: copy the template's disk
			t, err := o.Template(s.rec.TemplateID)
			if err != nil {
				return vmm.Drive{}, err
			}
			if err := sparseCopy(ctx, t.Rootfs, s.rec.Rootfs); err != nil {
				return vmm.Drive{}, err
			}
		}
		return vmm.Drive{ID: rootfsDrive, Path: s.rec.Rootfs}, nil
	}
	dev, err := o.sd.Create(ctx, rpc.CreateParams{Image: s.rec.RootfsImage, Owner: s.rec.ID})
	if errors.Is(err, rpc.ErrCapacity) {
		return vmm.Drive{}, fmt.Errorf("rootfs device: %w: %w", err, ErrCapacity)
	}
	if err != nil {
		return vmm.Drive{}, fmt.Errorf("rootfs device: %w", err)
	}
	s.mu.Lock()
	s.rec.Device, s.rec.HasDevice = dev.ID, true
	s.mu.Unlock()
	return vmm.Drive{ID: rootfsDrive, NBD: &vmm.NBDSource{Socket: dev.Socket, Export: dev.Export}}, nil
}

// releaseDevice deletes the sandbox's daemon device, if it has one.
func (o *Orchestrator) releaseDevice(ctx context.Context, s *sandbox) {
	s.mu.Lock()
	id, has := s.rec.Device, s.rec.HasDevice
	s.rec.Device, s.rec.HasDevice = 0, false
	s.mu.Unlock()
	if o.sd == nil || !has {
		return
	}
	if err := o.sd.Delete(context.WithoutCancel(ctx), id); err != nil {
		o.log.Warn("delete rootfs device", "sandbox", s.rec.ID, "device", id, "err", err)
	}
}

// sealRootfs (vCPUs stopped, drives flushed) makes the disk's content as
// of now durable: in daemon mode the device's upper is sealed into
// <dir>/rootfs-<gen>.lsmt (the device goes on with a fresh upper on top)
// and the record points at a config listing the device's layers; in file
// mode the disk file is fsynced.
func (o *Orchestrator) sealRootfs(ctx context.Context, s *sandbox) error {
	s.mu.Lock()
	rec := s.rec
	s.mu.Unlock()
	if o.sd == nil {
		return atomicfile.SyncFile(rec.Rootfs)
	}
	cfg, err := sealDevice(ctx, o.sd, rec, fmt.Sprintf("rootfs-%d", rec.Gen), "sandbox "+rec.ID)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.rec.RootfsImage = cfg
	s.mu.Unlock()
	return nil
}

// sealDevice seals rec's device's upper into <dir>/<name>.lsmt, unless a
// seal a crash interrupted got that far already, and writes <dir>/<name>.json
// listing the device's layers (the daemon's list is the truth: it changed
// with the restack). It returns that config. The device stays.
func sealDevice(ctx context.Context, sd *client.Client, rec Record, name, message string) (string, error) {
	if !rec.HasDevice {
		return "", fmt.Errorf("seal rootfs of %s: no device", rec.ID)
	}
	layer := filepath.Join(rec.Dir, name+".lsmt")
	layers, err := deviceLayers(ctx, sd, rec.Device)
	if err != nil {
		return "", fmt.Errorf("seal rootfs of %s: %w", rec.ID, err)
	}
	if len(layers) == 0 || layers[len(layers)-1] != layer {
		res, err := sd.Restack(ctx, rpc.RestackParams{ID: rec.Device, Layer: layer, Message: message})
		if err != nil {
			return "", fmt.Errorf("seal rootfs of %s: restack: %w", rec.ID, err)
		}
		layers = res.Device.Layers
	}
	cfg := filepath.Join(rec.Dir, name+".json")
	if err := imageConfig(cfg, layers); err != nil {
		return "", fmt.Errorf("seal rootfs of %s: %w", rec.ID, err)
	}
	return cfg, nil
}

// sealAndDelete (VM stopped) seals rec's device into
// <dir>/rootfs-<gen>.lsmt, points rec at the config listing it and deletes
// the device: for build and template VMs, whose disk is committed once.
func sealAndDelete(ctx context.Context, sd *client.Client, rec *Record) error {
	cfg, err := sealDevice(ctx, sd, *rec, fmt.Sprintf("rootfs-%d", rec.Gen), "sandbox "+rec.ID)
	if err != nil {
		return err
	}
	if err := sd.Delete(context.WithoutCancel(ctx), rec.Device); err != nil {
		return fmt.Errorf("seal rootfs of %s: delete device: %w", rec.ID, err)
	}
	rec.RootfsImage, rec.Device, rec.HasDevice = cfg, 0, false
	return nil
}

// deviceLayers returns the sealed layers of a daemon device, bottom first.
func deviceLayers(ctx context.Context, sd *client.Client, id uint32) ([]string, error) {
	devs, err := sd.List(ctx)
	if err != nil {
		return nil, err
	}
	for _, d := range devs {
		if d.ID == id {
			return d.Layers, nil
		}
	}
	return nil, fmt.Errorf("storage device %d: %w", id, ErrNotFound)
}
