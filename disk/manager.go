package disk

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/storage/daemon/client"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/template"
	"github.com/agentenv/agentenv/vmm"
	"github.com/prometheus/client_golang/prometheus"
)

// Devices is the storage daemon as the node reaches it: its RPC client or
// the daemon in process (StartLocal).
type Devices = client.Devices

// RootfsDrive is the VMM drive id of a VM's root disk.
const RootfsDrive = "rootfs"

// Options configure a Manager.
type Options struct {
	// Devices is the storage daemon serving the node's disks (required).
	Devices Devices
	// Backend names it for the node's description ("storaged", "local").
	Backend string
	// Driver is the node's VMM driver: whether it speaks NBD and maps
	// devices as memory decides the transport and memory devices.
	Driver vmm.Driver
	// PoolLow and PoolHigh are the watermarks of the daemon's warm pool of
	// root disks per template (zero: no pool).
	PoolLow, PoolHigh int
	// MemoryDevices asks for shared memory devices where the node can
	// have them (memory.go).
	MemoryDevices bool
	// Remote, when set, fetches the repository's layers a lazy rootfs
	// reads by URL (lazy.go).
	Remote Fetcher
	// Moved is called once an image config's remote layers are local
	// files (lazy.go); nil ignores it.
	Moved      func(cfg string)
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Manager is the node's disks on one storage daemon.
type Manager struct {
	sd                client.Devices
	backend           string
	poolLow, poolHigh int
	log               *slog.Logger
	// block, when set, also exports each disk as a kernel block device of
	// that kind (rpc.BlockUblk, rpc.BlockNBD), which the VMM opens by path;
	// chosen once in New (rpc.ChooseBlock).
	block string

	warmMu sync.Mutex
	warmed map[string]bool // image configs given a warm pool

	lazy *lazyRootfs
	// mem, when set, maps restored VMs' memory from shared devices; memWhy
	// says why not.
	mem    *MemoryDevices
	memWhy string
}

// Open returns a Manager of devices for the steps that only seal and
// delete (recovery before the node starts): no transport chosen, no
// memory devices, no lazy layers.
func Open(devices Devices, log *slog.Logger) (*Manager, error) {
	if devices == nil {
		return nil, errors.New("disk: no storage daemon given")
	}
	if log == nil {
		log = slog.Default()
	}
	m := &Manager{sd: devices, backend: "storaged", log: log, warmed: map[string]bool{}, memWhy: "storage.memory_devices is off"}
	m.lazy = newLazyRootfs(m, nil, nil, nil)
	return m, nil
}

// New returns the node's Manager: it asks the daemon what it can do once
// (kernel block devices, ublk for shared memory devices).
func New(ctx context.Context, opts Options) (*Manager, error) {
	m, err := Open(opts.Devices, opts.Logger)
	if err != nil {
		return nil, err
	}
	if opts.Backend != "" {
		m.backend = opts.Backend
	}
	m.poolLow, m.poolHigh = opts.PoolLow, opts.PoolHigh
	m.lazy = newLazyRootfs(m, opts.Remote, opts.Moved, opts.Registerer)
	// Disks reach the VMM as ublk devices where the daemon can make them,
	// else the way the VMM reaches NBD (rpc.ChooseBlock).
	nc, _ := opts.Driver.(vmm.NBDDriver)
	var shared string
	if f, err := m.sd.Features(ctx); err == nil {
		m.block, shared = rpc.ChooseBlock(f, nc != nil && nc.SpeaksNBD()), f.SharedBlock
	} else {
		m.log.Warn("storage daemon features unknown; disks go over NBD sockets", "err", err)
	}
	if opts.MemoryDevices {
		m.mem, m.memWhy = newMemoryDevices(m.sd, m.block, shared, opts.Driver, m.lazy, m.log)
	}
	return m, nil
}

// Backend names where the node's disks live.
func (m *Manager) Backend() string { return m.backend }

// Transport names how VMs reach their disks: a kernel block device (ublk,
// nbd) or NBD over the daemon's socket.
func (m *Manager) Transport() string {
	if m.block == "" {
		return "nbd-socket"
	}
	return m.block
}

// Memory returns the shared memory devices (nil when the node has none)
// and why there are none.
func (m *Manager) Memory() (*MemoryDevices, string) { return m.mem, m.memWhy }

// Close stops the fetches of lazy layers (a restart resumes them).
func (m *Manager) Close() { m.lazy.close() }

// Attach makes a device of owner's root disk on the image config cfg
// (confined as as, when set: see sandbox.Disk) and returns the VM's drive
// and the device.
func (m *Manager) Attach(ctx context.Context, owner, cfg string, as *vmm.Identity) (vmm.Drive, uint32, error) {
	done := m.lazy.creating() // a config moving to local files waits for this device (lazy.go)
	dev, err := m.sd.Create(ctx, rpc.CreateParams{Image: cfg, Owner: owner, Block: m.block, ConnectAs: connectAs(as)})
	done()
	if errors.Is(err, rpc.ErrCapacity) {
		return vmm.Drive{}, 0, fmt.Errorf("rootfs device: %w: %w", err, errdefs.ErrCapacity)
	}
	if err != nil {
		return vmm.Drive{}, 0, fmt.Errorf("rootfs device: %w", err)
	}
	return m.vmDrive(RootfsDrive, dev, false), dev.ID, nil
}

// AttachDrive makes the device of owner's extra drive d: a read-only one
// exports the image's layers alone, a writable one stacks a fresh upper on
// them.
func (m *Manager) AttachDrive(ctx context.Context, owner, id string, d snapshot.Drive, as *vmm.Identity) (vmm.Drive, uint32, error) {
	done := m.lazy.creating() // its config may be a template's still reading remote layers (lazy.go)
	dev, err := m.sd.Create(ctx, rpc.CreateParams{Image: d.Config, ReadOnly: d.ReadOnly, Owner: owner, Block: m.block, ConnectAs: connectAs(as)})
	done()
	if errors.Is(err, rpc.ErrCapacity) {
		return vmm.Drive{}, 0, fmt.Errorf("drive device: %w: %w", err, errdefs.ErrCapacity)
	}
	if err != nil {
		return vmm.Drive{}, 0, fmt.Errorf("drive device: %w", err)
	}
	return m.vmDrive(id, dev, d.ReadOnly), dev.ID, nil
}

// vmDrive is how a VM reaches the device dev: by the path of its kernel
// block device when the node chose one, else over its NBD socket.
func (m *Manager) vmDrive(id string, dev rpc.Device, readOnly bool) vmm.Drive {
	if dev.BlockDevice != "" {
		return vmm.Drive{ID: id, Path: dev.BlockDevice, ReadOnly: readOnly}
	}
	return vmm.Drive{ID: id, ReadOnly: readOnly, NBD: &vmm.NBDSource{Socket: dev.Socket, Export: dev.Export}}
}

// connectAs is the storage daemon's form of a confined VMM's identity.
func connectAs(as *vmm.Identity) *rpc.Identity {
	if as == nil {
		return nil
	}
	return &rpc.Identity{UID: as.UID, GID: as.GID}
}

// Detach deletes device id of owner; a failure is logged (the device is
// reclaimed at the next start).
func (m *Manager) Detach(ctx context.Context, owner string, id uint32) {
	if err := m.sd.Delete(context.WithoutCancel(ctx), id); err != nil && !errors.Is(err, rpc.ErrNotFound) {
		m.log.Warn("delete device (reclaimed at the next start)", "owner", owner, "device", id, "err", err)
	}
}

// DeleteDevices deletes owner's devices ids (a device already gone is no
// error).
func (m *Manager) DeleteDevices(ctx context.Context, owner string, ids []uint32) error {
	var errs []error
	for _, id := range ids {
		if err := m.sd.Delete(ctx, id); err != nil && !errors.Is(err, rpc.ErrNotFound) {
			errs = append(errs, fmt.Errorf("delete device %d of %s: %w", id, owner, err))
		}
	}
	return errors.Join(errs...)
}

// Reclaim deletes the daemon's runtime devices that held (device id to
// owner) does not name with their owner: a crash between creating a device
// and recording it, or mid template build.
func (m *Manager) Reclaim(ctx context.Context, held map[uint32]string) error {
	devs, err := m.sd.List(ctx)
	if err != nil {
		return fmt.Errorf("reclaim devices: %w", err)
	}
	for _, d := range devs {
		if owner, ok := held[d.ID]; d.Kind != rpc.KindRuntime || ok && owner == d.Owner {
			continue
		}
		if err := m.sd.Delete(ctx, d.ID); err != nil {
			m.log.Warn("reclaim storage device", "device", d.ID, "owner", d.Owner, "err", err)
			continue
		}
		m.log.Info("reclaimed orphaned storage device", "device", d.ID, "owner", d.Owner)
	}
	return nil
}

// Assign hands device id to owner (a pooled VM's disk taken by a sandbox).
func (m *Manager) Assign(ctx context.Context, id uint32, owner string) error {
	if _, err := m.sd.Assign(ctx, rpc.AssignParams{ID: id, Owner: owner}); err != nil {
		return fmt.Errorf("assign device %d to %s: %w", id, owner, err)
	}
	return nil
}

// Rebase moves device id, never written, onto the lowers of image config
// cfg.
func (m *Manager) Rebase(ctx context.Context, id uint32, cfg string) error {
	if _, err := m.sd.Rebase(ctx, rpc.RebaseParams{ID: id, Image: cfg}); err != nil {
		return fmt.Errorf("rebase device %d onto %s: %w", id, cfg, err)
	}
	return nil
}

// Warm keeps root disks of t ready in the daemon's warm pool, once per
// image config.
func (m *Manager) Warm(ctx context.Context, t *template.Template) {
	// No pool device is made from remote layers: the daemon makes them on
	// its own, which no move onto local files would wait for (lazy.go
	// warms the template once its layers are here).
	if t.RootfsImage == "" || m.poolHigh <= 0 || IsRemote(t.RootfsImage) {
		return
	}
	m.warmMu.Lock()
	done := m.warmed[t.RootfsImage]
	m.warmed[t.RootfsImage] = true
	m.warmMu.Unlock()
	if done {
		return
	}
	p := rpc.WarmParams{Image: t.RootfsImage, Low: m.poolLow, High: m.poolHigh}
	if err := m.sd.Warm(ctx, p); err != nil {
		m.warmMu.Lock()
		delete(m.warmed, t.RootfsImage)
		m.warmMu.Unlock()
		m.log.Warn("storage warm pool", "template", t.ID, "err", err)
	}
}
