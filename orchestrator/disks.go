package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/template"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/storage/daemon/client"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	storimage "github.com/agentenv/agentenv/storage/image"
	"github.com/agentenv/agentenv/vmm"
)

// Root disks come from one backend, chosen once in New:
//
//   - daemonDisks (Options.Storage set): a template's rootfs is a stack of
//     sealed layers; each VM gets an NBD export of those layers plus a
//     fresh writable upper from aenv-storaged; a seal restacks the upper
//     into a new layer and the sandbox's image config lists it on top;
//   - fileDisks (no daemon): a sparse copy of the template's rootfs file
//     per sandbox, fsynced on seal.
type diskBackend interface {
	name() string
	// transport names how VMs reach their disks (nbd-socket, nbd, ublk,
	// file).
	transport() string
	// prepare gives a new sandbox rec its own disk from template t.
	prepare(ctx context.Context, t *template.Template, rec *Record) error
	// attach makes rec's disk available to a VM (confined as as, when set:
	// see sandbox.Disk); a device it creates is returned for the record.
	attach(ctx context.Context, rec Record, as *vmm.Identity) (vmm.Drive, device, error)
	// drive makes an extra drive of owner available to a VM (drives.go).
	drive(ctx context.Context, owner string, d snapshot.Drive, as *vmm.Identity) (vmm.Drive, device, error)
	// detach releases a device attach or drive created.
	detach(ctx context.Context, owner string, d device)
	// seal (vCPUs stopped, drives flushed) makes the disk's content as of
	// now durable. It returns the image config of that content: the disk's
	// layers with the sealed one on top, which the device goes on on unless
	// mode keeps its upper ("" when the disk is a file, which stays).
	seal(ctx context.Context, rec Record, name, message string, mode sealMode) (string, error)
	// copyInto puts the disk rec has now into the snapshot directory dir
	// (shared layers are hard-linked) and fills r's disk fields.
	copyInto(ctx context.Context, rec Record, dir string, r *snapshot.Record) error
	// templateDisk prepares the writable disk a template boots from (raw
	// is its ext4 image); finish, once the VM stopped, commits it to t
	// (commit) or cleans up.
	templateDisk(ctx context.Context, t *template.Template, raw string) (sandbox.Disk, func(ctx context.Context, commit bool) error, error)
	// warm keeps root disks of t ready (daemon only).
	warm(ctx context.Context, t *template.Template)
}

// device is a storage-daemon device a VM's disk holds.
type device struct {
	ID  uint32
	Has bool
}

// vmDisk is a sandbox's root disk as a VM bring-up sees it
// (sandbox.Disk): attach records the device in the sandbox.
type vmDisk struct {
	o *Orchestrator
	s *instance
}

func (d vmDisk) Attach(ctx context.Context, as *vmm.Identity) (vmm.Drive, error) {
	d.s.mu.Lock()
	rec := d.s.rec
	d.s.mu.Unlock()
	drive, dev, err := d.o.disks.attach(ctx, rec, as)
	if err != nil {
		return drive, err
	}
	d.s.mu.Lock()
	d.s.rec.Device, d.s.rec.HasDevice = dev.ID, dev.Has
	d.s.mu.Unlock()
	return drive, nil
}

func (d vmDisk) Detach(ctx context.Context) { d.o.releaseDevice(ctx, d.s) }

// releaseDevice releases the sandbox's devices: its root disk's and its
// drives'.
func (o *Orchestrator) releaseDevice(ctx context.Context, s *instance) {
	s.mu.Lock()
	ids, id := s.rec.devices(), s.rec.ID
	s.rec.clearDevices()
	s.mu.Unlock()
	for _, dev := range ids {
		o.disks.detach(ctx, id, device{ID: dev, Has: true})
	}
}

// sealRootfs seals the disk of a sandbox being paused (see
// diskBackend.seal; the device keeps its upper and goes next) and points
// the record (in memory; the caller persists) at the sealed config.
func (o *Orchestrator) sealRootfs(ctx context.Context, s *instance) error {
	s.mu.Lock()
	rec := s.rec
	s.mu.Unlock()
	cfg, err := o.disks.seal(ctx, rec, fmt.Sprintf("rootfs-%d", rec.Gen), "sandbox "+rec.ID, keepUpper)
	if err != nil || cfg == "" {
		return err
	}
	s.mu.Lock()
	s.rec.RootfsImage = cfg
	s.mu.Unlock()
	return nil
}

// daemonDisks keeps root disks in aenv-storaged.
type daemonDisks struct {
	sd                client.Devices
	poolLow, poolHigh int
	log               *slog.Logger
	warmed            map[string]bool // image configs given a warm pool; guarded by the orchestrator's matMu
	o                 *Orchestrator
	// block, when set, also exports each disk as a kernel block device of
	// that kind (rpc.BlockUblk, rpc.BlockNBD), which the VMM opens by path;
	// chosen once in New (rpc.ChooseBlock).
	block string
}

func (d *daemonDisks) name() string { return "storaged" }

// transport names how VMs reach their disks.
func (d *daemonDisks) transport() string {
	if d.block == "" {
		return "nbd-socket"
	}
	return d.block
}

func (d *daemonDisks) prepare(_ context.Context, t *template.Template, rec *Record) error {
	rec.RootfsImage = t.RootfsImage
	return nil
}

func (d *daemonDisks) attach(ctx context.Context, rec Record, as *vmm.Identity) (vmm.Drive, device, error) {
	done := d.o.lazy.creating() // a config moving to local files waits for this device (lazy.go)
	dev, err := d.sd.Create(ctx, rpc.CreateParams{Image: rec.RootfsImage, Owner: rec.ID, Block: d.block, ConnectAs: connectAs(as)})
	done()
	if errors.Is(err, rpc.ErrCapacity) {
		return vmm.Drive{}, device{}, fmt.Errorf("rootfs device: %w: %w", err, ErrCapacity)
	}
	if err != nil {
		return vmm.Drive{}, device{}, fmt.Errorf("rootfs device: %w", err)
	}
	return d.vmDrive(rootfsDrive, dev, false), device{ID: dev.ID, Has: true}, nil
}

// vmDrive is how a VM reaches the device dev: by the path of its kernel
// block device when the node chose one (d.block), else over its NBD socket.
func (d *daemonDisks) vmDrive(id string, dev rpc.Device, readOnly bool) vmm.Drive {
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

func (d *daemonDisks) detach(ctx context.Context, owner string, dev device) {
	if err := d.sd.Delete(context.WithoutCancel(ctx), dev.ID); err != nil && !errors.Is(err, rpc.ErrNotFound) {
		d.log.Warn("delete rootfs device (reclaimed at the next start)", "sandbox", owner, "device", dev.ID, "err", err)
	}
}

func (d *daemonDisks) seal(ctx context.Context, rec Record, name, message string, mode sealMode) (string, error) {
	// The config a seal writes lists the device's layers: files only, so
	// that uploads and snapshots can read them (lazy.go).
	if err := d.o.lazy.settle(ctx, rec.RootfsImage); err != nil {
		return "", err
	}
	return sealDevice(ctx, d.sd, rec, name, message, mode)
}

func (d *daemonDisks) copyInto(_ context.Context, rec Record, dir string, r *snapshot.Record) error {
	layers, err := snapshot.LayersOf(rec.RootfsImage)
	if err != nil {
		return err
	}
	snapLayers, err := snapshot.AdoptLayers(layers, rec.Dir, dir)
	if err != nil {
		return err
	}
	r.RootfsImage = filepath.Join(dir, "rootfs.json")
	return snapshot.WriteImageConfig(r.RootfsImage, snapLayers)
}

func (d *daemonDisks) templateDisk(ctx context.Context, t *template.Template, raw string) (sandbox.Disk, func(ctx context.Context, commit bool) error, error) {
	base := filepath.Join(t.Dir, "rootfs-0.lsmt")
	if _, err := storimage.ImportRaw(ctx, raw, base, storimage.CommitOptions{Message: "guest rootfs " + raw}); err != nil {
		return nil, nil, err
	}
	bootCfg := filepath.Join(t.Dir, "rootfs-boot.json")
	if err := snapshot.WriteImageConfig(bootCfg, []string{base}); err != nil {
		return nil, nil, err
	}
	// The device is made when the VM attaches it, as the VM's identity (a
	// confined VMM reconnects to it after a storage restart); finish, not
	// the VM's tear-down, releases or seals it.
	disk := &templateBootDisk{recordDisk{o: d.o, rec: &Record{ID: "template-" + t.ID, Dir: t.Dir, Gen: 1, RootfsImage: bootCfg}}}
	finish := func(ctx context.Context, commit bool) error {
		if !commit || !disk.rec.HasDevice {
			disk.recordDisk.Detach(ctx)
			return nil
		}
		if err := sealAndDelete(ctx, d.sd, disk.rec); err != nil {
			disk.recordDisk.Detach(ctx)
			return err
		}
		t.RootfsImage = disk.rec.RootfsImage
		return nil
	}
	return disk, finish, nil
}

func (d *daemonDisks) warm(ctx context.Context, t *template.Template) {
	// No pool device is made from remote layers: the daemon makes them on
	// its own, which no move onto local files would wait for (lazy.go
	// warms the template once its layers are here).
	if t.RootfsImage == "" || d.poolHigh <= 0 || isRemote(t.RootfsImage) {
		return
	}
	d.o.matMu.Lock()
	done := d.warmed[t.RootfsImage]
	d.warmed[t.RootfsImage] = true
	d.o.matMu.Unlock()
	if done {
		return
	}
	p := rpc.WarmParams{Image: t.RootfsImage, Low: d.poolLow, High: d.poolHigh}
	if err := d.sd.Warm(ctx, p); err != nil {
		d.o.matMu.Lock()
		delete(d.warmed, t.RootfsImage)
		d.o.matMu.Unlock()
		d.log.Warn("storage warm pool", "template", t.ID, "err", err)
	}
}

// fileDisks keeps each sandbox's root disk as a sparse file of its own.
type fileDisks struct {
	o *Orchestrator
}

func (fileDisks) name() string { return "files" }

func (fileDisks) transport() string { return "file" }

func (f fileDisks) prepare(ctx context.Context, t *template.Template, rec *Record) error {
	rec.Rootfs = filepath.Join(rec.Dir, "rootfs.ext4")
	return snapshot.SparseCopy(ctx, t.Rootfs, rec.Rootfs)
}

// attach ignores as: a file disk is opened by the VMM before it drops
// privileges.
func (f fileDisks) attach(_ context.Context, rec Record, _ *vmm.Identity) (vmm.Drive, device, error) {
	if _, err := os.Stat(rec.Rootfs); err != nil {
		return vmm.Drive{}, device{}, fmt.Errorf("rootfs of %s: %w", rec.ID, err)
	}
	return vmm.Drive{ID: rootfsDrive, Path: rec.Rootfs}, device{}, nil
}

func (fileDisks) detach(context.Context, string, device) {}

func (fileDisks) seal(_ context.Context, rec Record, _, _ string, _ sealMode) (string, error) {
	return "", atomicfile.SyncFile(rec.Rootfs)
}

func (fileDisks) copyInto(ctx context.Context, rec Record, dir string, r *snapshot.Record) error {
	r.Rootfs = filepath.Join(dir, "rootfs.ext4")
	return snapshot.SparseCopy(ctx, rec.Rootfs, r.Rootfs)
}

func (fileDisks) templateDisk(ctx context.Context, t *template.Template, raw string) (sandbox.Disk, func(ctx context.Context, commit bool) error, error) {
	t.Rootfs = filepath.Join(t.Dir, "rootfs.ext4")
	if err := snapshot.SparseCopy(ctx, raw, t.Rootfs); err != nil {
		return nil, nil, err
	}
	return preparedDisk{vmm.Drive{ID: rootfsDrive, Path: t.Rootfs}}, func(context.Context, bool) error { return nil }, nil
}

func (fileDisks) warm(context.Context, *template.Template) {}

// recordDisk is the root disk of a VM described by a bare record (a build
// VM): attach records the device in rec, detach releases it unless a seal
// already did.
type recordDisk struct {
	o   *Orchestrator
	rec *Record
}

func (d *recordDisk) Attach(ctx context.Context, as *vmm.Identity) (vmm.Drive, error) {
	drive, dev, err := d.o.disks.attach(ctx, *d.rec, as)
	if err == nil {
		d.rec.Device, d.rec.HasDevice = dev.ID, dev.Has
	}
	return drive, err
}

func (d *recordDisk) Detach(ctx context.Context) {
	if d.rec.HasDevice {
		d.o.disks.detach(ctx, d.rec.ID, device{ID: d.rec.Device, Has: true})
		d.rec.Device, d.rec.HasDevice = 0, false
	}
}

// templateBootDisk is the disk a template boots from on the storage
// daemon: attached as any record's, released or sealed by templateDisk's
// finish only (the VM's Detach leaves it).
type templateBootDisk struct{ recordDisk }

func (*templateBootDisk) Detach(context.Context) {}

// preparedDisk is a drive its owner prepared and releases itself (a
// template's boot file disk: fileDisks.templateDisk).
type preparedDisk struct{ drive vmm.Drive }

func (d preparedDisk) Attach(context.Context, *vmm.Identity) (vmm.Drive, error) { return d.drive, nil }
func (preparedDisk) Detach(context.Context)                                     {}
