package disk

import (
	"context"
	"path/filepath"

	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot"
	storimage "github.com/agentenv/agentenv/storage/image"
	"github.com/agentenv/agentenv/template"
	"github.com/agentenv/agentenv/vmm"
)

// Owned is the root disk of a VM no sandbox record describes (a build VM,
// a template's boot VM, a pooled VM): attach makes its device, detach
// deletes it unless a seal already did.
type Owned struct {
	m        *Manager
	owner    string
	dir, cfg string
	dev      uint32
	has      bool
}

// Owned returns the root disk of owner on image config cfg, whose seals
// go into dir.
func (m *Manager) Owned(owner, dir, cfg string) *Owned {
	return &Owned{m: m, owner: owner, dir: dir, cfg: cfg}
}

// Attach makes the disk's device (sandbox.Disk).
func (d *Owned) Attach(ctx context.Context, as *vmm.Identity) (vmm.Drive, error) {
	drive, id, err := d.m.Attach(ctx, d.owner, d.cfg, as)
	if err == nil {
		d.dev, d.has = id, true
	}
	return drive, err
}

// Detach deletes the disk's device, if it has one (sandbox.Disk).
func (d *Owned) Detach(ctx context.Context) {
	if d.has {
		d.m.Detach(ctx, d.owner, d.dev)
		d.dev, d.has = 0, false
	}
}

// Device returns the disk's device and whether it has one.
func (d *Owned) Device() (uint32, bool) { return d.dev, d.has }

// Seal (VM stopped) waits until the disk's layers are local files, seals
// the device into <dir>/rootfs-1.lsmt, deletes it and returns the config
// listing the sealed stack (template.Disk): a build's commit.
func (d *Owned) Seal(ctx context.Context) (string, error) {
	if err := d.m.lazy.settle(ctx, d.cfg); err != nil {
		return "", err
	}
	cfg, err := d.m.SealAndDelete(ctx, Held{Owner: d.owner, Dir: d.dir, Device: d.dev, Has: d.has}, "rootfs-1", "sandbox "+d.owner)
	if err != nil {
		return "", err
	}
	d.cfg, d.dev, d.has = cfg, 0, false
	return cfg, nil
}

// BuildDisk is the root disk of build VM id on image config cfg, committed
// once by its Seal.
func (m *Manager) BuildDisk(id, dir, cfg string) template.Disk { return m.Owned(id, dir, cfg) }

// bootDisk is the disk a template boots from: attached as any owned
// disk's, released or sealed by TemplateDisk's finish only (the VM's
// Detach leaves it).
type bootDisk struct{ *Owned }

func (bootDisk) Detach(context.Context) {}

// TemplateDisk prepares the writable disk template t boots from (raw is
// its ext4 image) on a base layer of its own; finish, once the VM stopped,
// commits it to t.RootfsImage (commit) or deletes it.
func (m *Manager) TemplateDisk(ctx context.Context, t *template.Template, raw string) (sandbox.Disk, func(ctx context.Context, commit bool) error, error) {
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
	d := m.Owned("template-"+t.ID, t.Dir, bootCfg)
	finish := func(ctx context.Context, commit bool) error {
		if !commit || !d.has {
			d.Detach(ctx)
			return nil
		}
		cfg, err := m.SealAndDelete(ctx, Held{Owner: d.owner, Dir: d.dir, Device: d.dev, Has: true}, "rootfs-1", "sandbox "+d.owner)
		if err != nil {
			d.Detach(ctx)
			return err
		}
		d.dev, d.has = 0, false
		t.RootfsImage = cfg
		return nil
	}
	return bootDisk{d}, finish, nil
}
