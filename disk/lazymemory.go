package disk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/storage/blob"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/image"
)

// Lazy memory. Where VMs map their memory from the storage daemon's shared
// export of the stack (MemoryDevices), a repository import names the
// memory layers it does not hold by the layer socket's URLs, as it does the
// rootfs layers (package replica): the export reads them through the
// socket, verified chunk by chunk, and a restore on a node that lacks them
// starts at once. Once the VM answered, the stack's config gets the same
// background job as a lazy rootfs config (lazy.go): the layers are fetched
// whole into the config's directory and the config names the files, so
// VMs restored from the stack afterwards get an export of local files (the
// daemon sees a changed config and makes a new export; the VMs mapping the
// old one keep it, and it reads the same bytes). A capture needs the layers
// as files (it reads the top layer's identity, and a pause's commit
// uploads files): Local waits for the job and names them by the copies,
// linked into the capturing sandbox's directory so that they outlive the
// snapshot directory they were fetched into.

// localCopy is where a fetch of ref (a lazy URL) into dir puts the layer
// ("" when ref is no lazy URL).
func localCopy(dir, ref string) string {
	digest, ok := blob.URLDigest(ref)
	if !blob.IsURL(ref) || !ok {
		return ""
	}
	return filepath.Join(dir, strings.TrimPrefix(digest, "sha256:"))
}

// fetchLater notes a stack config naming remote layers for the background
// fetch, started once the VM that maps it answered (Manager.StartLocalize).
func (d *MemoryDevices) fetchLater(cfg string) {
	if d.lazy != nil && IsRemote(cfg) {
		d.lazy.deferStart(cfg)
	}
}

// Local returns m with its remote layers (URLs) named by local files: the
// copies the background fetch of the stack of m.File (the export a VM
// maps) made, waited for when it has not finished, hard-linked into dir.
func (d *MemoryDevices) Local(ctx context.Context, m snapshot.MemoryImage, dir string) (snapshot.MemoryImage, error) {
	if !slices.ContainsFunc(m.Layers, blob.IsURL) {
		return m, nil
	}
	dev, err := d.exportOf(ctx, m.File)
	if err != nil {
		return m, err
	}
	cfg := dev.Image
	if d.lazy == nil {
		return m, fmt.Errorf("memory stack %s names remote layers and the node fetches none", cfg)
	}
	if err := d.lazy.settle(ctx, cfg); err != nil {
		return m, fmt.Errorf("memory stack %s: %w", cfg, err)
	}
	c, err := image.LoadConfig(cfg)
	if err != nil {
		return m, err
	}
	out := slices.Clone(m.Layers)
	for i, l := range m.Layers {
		if !blob.IsURL(l) {
			continue
		}
		src := localCopy(filepath.Dir(cfg), l)
		if i >= len(c.Lowers) || c.Lowers[i].File != src {
			return m, fmt.Errorf("memory stack %s does not name the local copy of layer %d (%s)", cfg, i, l)
		}
		if out[i], err = linkInto(src, dir); err != nil {
			return m, fmt.Errorf("memory layer %s: %w", l, err)
		}
	}
	m.Layers = out
	return m, nil
}

// exportOf is the shared device exported as file (a VM's
// snapshot.MemoryImage File); its Image is the stack's config.
func (d *MemoryDevices) exportOf(ctx context.Context, file string) (rpc.Device, error) {
	devs, err := d.sd.List(ctx)
	if err != nil {
		return rpc.Device{}, fmt.Errorf("list memory devices: %w", err)
	}
	for _, dev := range devs {
		if dev.Kind == rpc.KindShared && dev.BlockDevice == file && file != "" {
			return dev, nil
		}
	}
	return rpc.Device{}, fmt.Errorf("no memory device is exported as %q", file)
}

// linkInto hard-links the sealed layer src into dir under its own name
// (kept when already there: the name is the layer's digest), durably: a
// record names it next.
func linkInto(src, dir string) (string, error) {
	dst := filepath.Join(dir, filepath.Base(src))
	if filepath.Dir(src) == filepath.Clean(dir) {
		return src, nil
	}
	if _, err := os.Stat(dst); err == nil {
		return dst, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	if err := snapshot.LinkOrCopy(src, dst); err != nil {
		return "", err
	}
	if err := atomicfile.SyncDir(dir); err != nil {
		return "", err
	}
	return dst, nil
}

// LocalMemory is MemoryDevices.Local where the node maps memory from
// shared devices; elsewhere m (a node without them never imports memory
// lazily).
func (m *Manager) LocalMemory(ctx context.Context, img snapshot.MemoryImage, dir string) (snapshot.MemoryImage, error) {
	if m.mem == nil {
		return img, nil
	}
	return m.mem.Local(ctx, img, dir)
}
