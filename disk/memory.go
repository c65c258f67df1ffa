package disk

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/image"
	"github.com/agentenv/agentenv/vmm"
)

// Memory from a shared device: where the node's disks are ublk devices
// and the VMM maps a block device as guest memory, a VM restored from a
// layered memory image maps the storage daemon's shared read-only ublk
// device of the image's layer stack instead of a node-local flattened file.
// One device per stack, held by every VM that maps it (a fork's children,
// the sandboxes of one template): the kernel's page cache holds its pages
// once, and nothing is flattened. The device outlives a restart of the
// daemon (ublk user recovery), so a VM's memory does too; kernel NBD does
// not, which is why only ublk qualifies. Where the daemon was started to
// export shared memory over FUSE instead (rpc.Features.SharedBlock, package
// storage/memfs), the VM maps the daemon's read-only file of the stack the
// same way; that file outlives a restart of the daemon too, even a SIGKILL:
// a keeper process holds the mount's FUSE connection and the restarted
// daemon takes it over (requests the dead one left unanswered are resent
// to it). Only the keeper and the daemon dying together ends the mount
// (the VMs then fault with SIGBUS). A VM's
// hold is given back once its VMM is gone (sandbox.Memory.Release); a
// node's start gives back the holds no running VM has.

// sharedDevices is what the storage daemon's client offers for shared
// read-only devices.
type sharedDevices interface {
	Acquire(ctx context.Context, p rpc.AcquireParams) (rpc.Device, error)
	ReleaseShared(ctx context.Context, id uint32, holder string) error
	List(ctx context.Context) ([]rpc.Device, error)
	Prefetch(ctx context.Context, p rpc.PrefetchParams) (rpc.PrefetchResult, error)
}

// MemoryDevices acquires and releases the shared devices of memory stacks.
type MemoryDevices struct {
	sd   sharedDevices
	kind string // rpc.BlockUblk or rpc.BlockFUSE
	log  *slog.Logger
	// lazy fetches the layers a repository import left remote (lazymemory.go).
	lazy *lazyRootfs
	// mu serialises writing a stack's image config: the daemon tells a
	// stack's device by its config file, so the file is written once.
	mu sync.Mutex
}

// stackConfig is the image config of a snapshot directory's memory stack.
const stackConfig = "memory-stack.json"

// memoryDeviceMapper is the VMM capability of mapping a block device as
// guest memory.
type memoryDeviceMapper interface{ MapsDeviceMemory() bool }

// newMemoryDevices returns the component when the daemon exports shared
// memory as FUSE files (shared, rpc.Features.SharedBlock) or the node's
// disks are ublk devices (block, chosen in New), and the driver maps
// devices; else nil and why not.
func newMemoryDevices(sd sharedDevices, block, shared string, drv vmm.Driver, lazy *lazyRootfs, log *slog.Logger) (*MemoryDevices, string) {
	mm, ok := drv.(memoryDeviceMapper)
	name := "none"
	if drv != nil {
		name = drv.Name()
	}
	kind := rpc.BlockUblk
	switch {
	case shared == rpc.BlockFUSE:
		kind = rpc.BlockFUSE
	case block != rpc.BlockUblk:
		return nil, "the storage daemon makes no ublk devices here and was not started to export memory over FUSE"
	}
	if !ok || !mm.MapsDeviceMemory() {
		return nil, "the VMM (" + name + ") maps files only"
	}
	return &MemoryDevices{sd: sd, kind: kind, lazy: lazy, log: log}, ""
}

// Kind is how the node's VMs map shared memory: rpc.BlockUblk or
// rpc.BlockFUSE.
func (d *MemoryDevices) Kind() string { return d.kind }

// Describe names what a VM maps, for people: "ublk device" or "file on its
// FUSE mount" (the storage daemon's).
func (d *MemoryDevices) Describe() string {
	if d.kind == rpc.BlockFUSE {
		return "file on its FUSE mount"
	}
	return "ublk device"
}

// Acquire holds the shared device of m's layer stack (m read from vmDir's
// manifest) for holder and returns the image as the VM maps it (File the
// device) with the release of the hold.
func (d *MemoryDevices) Acquire(ctx context.Context, vmDir string, m snapshot.MemoryImage, holder string) (snapshot.MemoryImage, sandbox.Memory, error) {
	cfg, err := d.config(vmDir, m.Layers)
	if err != nil {
		return m, sandbox.Memory{}, err
	}
	dev, err := d.sd.Acquire(ctx, rpc.AcquireParams{Image: cfg, Holder: holder, Block: d.kind})
	if err != nil {
		return m, sandbox.Memory{}, fmt.Errorf("memory device of %s: %w", vmDir, err)
	}
	release := d.releaser(dev.ID, holder)
	if dev.Block != d.kind || dev.BlockDevice == "" {
		release(ctx)
		return m, sandbox.Memory{}, fmt.Errorf("memory device of %s: device %d is exported as %q, want %q", vmDir, dev.ID, dev.Block, d.kind)
	}
	m.File = dev.BlockDevice
	return m, sandbox.Memory{File: dev.BlockDevice, Release: release}, nil
}

// config writes vmDir's stack config once and returns its path. A config
// there that lists other layers (a snapshot directory linked from a paused
// sandbox's, whose layers were adopted under new names) is replaced.
func (d *MemoryDevices) config(vmDir string, layers []string) (string, error) {
	cfg := filepath.Join(vmDir, stackConfig)
	d.mu.Lock()
	defer d.mu.Unlock()
	if !listsLayers(cfg, layers) {
		if err := snapshot.WriteImageConfig(cfg, layers); err != nil {
			return "", fmt.Errorf("memory stack config of %s: %w", vmDir, err)
		}
	}
	d.fetchLater(cfg)
	return cfg, nil
}

// listsLayers reports whether the image config at path lists exactly
// layers, bottom first, and nothing else; a remote layer (URL) may be
// listed as the local copy a fetch made of it (lazymemory.go).
func listsLayers(path string, layers []string) bool {
	c, err := image.LoadConfig(path)
	if err != nil || c.Upper != nil || len(c.Lowers) != len(layers) {
		return false
	}
	for i, l := range c.Lowers {
		if l.File != layers[i] && l.URL != layers[i] && l.File != localCopy(filepath.Dir(path), layers[i]) {
			return false
		}
	}
	return true
}

// releaser returns the release of holder's hold on device id.
func (d *MemoryDevices) releaser(id uint32, holder string) func(context.Context) {
	return func(ctx context.Context) {
		err := d.sd.ReleaseShared(context.WithoutCancel(ctx), id, holder)
		if err != nil && !errors.Is(err, rpc.ErrNotFound) {
			d.log.Warn("release memory device (released at the next start)", "device", id, "holder", holder, "err", err)
		}
	}
}

// Adopted returns the release of the hold holder has on the memory device
// file (a VM adopted after a restart maps it), or nil when it has none.
func (d *MemoryDevices) Adopted(ctx context.Context, file, holder string) func(context.Context) {
	devs, err := d.sd.List(ctx)
	if err != nil {
		d.log.Warn("list memory devices", "err", err)
		return nil
	}
	for _, dev := range devs {
		if dev.Kind == rpc.KindShared && dev.BlockDevice == file && slices.Contains(dev.Holders, holder) {
			return d.releaser(dev.ID, holder)
		}
	}
	return nil
}

// ReleaseUnheld gives back the holds on memory devices (shared devices of
// configs named stackConfig) whose holder runs no VM: the VMs of a
// previous process that are gone.
func (d *MemoryDevices) ReleaseUnheld(ctx context.Context, running func(holder string) bool) {
	devs, err := d.sd.List(ctx)
	if err != nil {
		d.log.Warn("list memory devices", "err", err)
		return
	}
	for _, dev := range devs {
		if dev.Kind != rpc.KindShared || filepath.Base(dev.Image) != stackConfig {
			continue
		}
		for _, h := range dev.Holders {
			if running(h) {
				continue
			}
			d.log.Info("released a memory device hold no VM has", "device", dev.ID, "holder", h)
			d.releaser(dev.ID, h)(ctx)
		}
	}
}

// IsDevice reports whether a memory image's File is a shared device's
// path: a block device, or a file on the storage daemon's FUSE mount
// (RUN/mem/aenv-ID-NONCE, rpc.SharedFileDir).
func IsDevice(file string) bool {
	if strings.HasPrefix(file, "/dev/") {
		return true
	}
	return filepath.IsAbs(file) && filepath.Base(filepath.Dir(file)) == rpc.SharedFileDir &&
		strings.HasPrefix(filepath.Base(file), rpc.ExportPrefix)
}
