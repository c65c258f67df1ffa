package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

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
	if err := os.WriteFile(path+".tmp", b, 0o600); err != nil {
		return fmt.Errorf("write image config %s: %w", path, err)
	}
	return os.Rename(path+".tmp", path)
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

// sealRootfs (daemon mode, VM stopped) seals the device's upper into a new
// layer of the sandbox, points the sandbox's image config at it and deletes
// the device.
func (o *Orchestrator) sealRootfs(ctx context.Context, s *sandbox) error {
	if o.sd == nil {
		return nil
	}
	s.mu.Lock()
	rec := s.rec
	s.mu.Unlock()
	if err := sealDevice(ctx, o.sd, &rec); err != nil {
		return err
	}
	s.mu.Lock()
	s.rec.RootfsImage, s.rec.Device, s.rec.HasDevice = rec.RootfsImage, 0, false
	s.mu.Unlock()
	return nil
}

// sealDevice restacks rec's device into <dir>/rootfs-<gen>.lsmt, writes
// <dir>/rootfs-<gen>.json (the previous layers plus the new one), deletes
// the device and updates rec.
func sealDevice(ctx context.Context, sd *client.Client, rec *Record) error {
	if !rec.HasDevice {
		return fmt.Errorf("seal rootfs of %s: no device", rec.ID)
	}
	layers, err := layersOf(rec.RootfsImage)
	if err != nil {
		return fmt.Errorf("seal rootfs of %s: %w", rec.ID, err)
	}
	layer := filepath.Join(rec.Dir, fmt.Sprintf("rootfs-%d.lsmt", rec.Gen))
	if _, err := sd.Restack(ctx, rpc.RestackParams{ID: rec.Device, Layer: layer, Message: "sandbox " + rec.ID}); err != nil {
		return fmt.Errorf("seal rootfs of %s: restack: %w", rec.ID, err)
	}
	cfg := filepath.Join(rec.Dir, fmt.Sprintf("rootfs-%d.json", rec.Gen))
	if err := imageConfig(cfg, append(layers, layer)); err != nil {
		return fmt.Errorf("seal rootfs of %s: %w", rec.ID, err)
	}
	if err := sd.Delete(context.WithoutCancel(ctx), rec.Device); err != nil {
		return fmt.Errorf("seal rootfs of %s: delete device: %w", rec.ID, err)
	}
	rec.RootfsImage, rec.Device, rec.HasDevice = cfg, 0, false
	return nil
}
