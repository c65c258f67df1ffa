package catalog

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/agentenv/agentenv/guest/image"
	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/store"
	"github.com/agentenv/agentenv/template"
	"github.com/agentenv/agentenv/vmm"
)

// Files a template booted from, kept in its directory (buildDefault).
const (
	kernelFile = template.KernelFile
	initrdFile = template.InitrdFile
)

// BootCmdline is the kernel command line of every cold boot of a node's
// guest (a template's, a cold resume's) before the network arguments.
const BootCmdline = "root=/dev/vda rw quiet"

// EnsureDefault returns the default template, building it from the guest
// assets when the store has none: cold boot (writable copy of the rootfs),
// wait for the agent, pause, snapshot, stop, commit.
func (c *Catalog) EnsureDefault(ctx context.Context, assets *image.Assets) (*template.Template, error) {
	var t template.Template
	if err := c.cfg.Store.Get(store.Templates, template.DefaultID, &t); err == nil && t.RootfsImage != "" {
		c.Set(&t)
		return &t, nil
	} else if err == nil {
		c.log.Warn("the default template was built on file disks, which nodes no longer keep; building it again", "template", t.ID)
	}
	start := time.Now()
	t, err := c.buildDefault(ctx, template.DefaultID, assets)
	if err != nil {
		return nil, err
	}
	if err := c.cfg.Store.Put(store.Templates, t.ID, t); err != nil {
		return nil, err
	}
	c.Set(&t)
	c.log.Info("template built", "template", t.ID, "took", time.Since(start).Round(time.Millisecond))
	return &t, nil
}

// buildDefault boots the guest assets' rootfs once and snapshots the VM.
func (c *Catalog) buildDefault(ctx context.Context, id string, a *image.Assets) (t template.Template, err error) {
	dir := filepath.Join(c.cfg.DataDir, "templates", id)
	if err := os.RemoveAll(dir); err != nil { // a half-built leftover
		return t, fmt.Errorf("build template %s: %w", id, err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return t, fmt.Errorf("build template %s: %w", id, err)
	}
	t = template.Template{ID: id, Dir: dir, Snapshot: filepath.Join(dir, "snapshot"),
		VCPUs: c.cfg.VCPUs, MemoryMiB: c.cfg.MemoryMiB, EnvdVersion: template.AgentVersion, CreatedAt: time.Now().UTC()}
	// Kernel and initrd are copied so the template outlives the asset cache
	// (the snapshot's config names them).
	kernel, initrd, err := template.CopyBootFiles(ctx, dir, a.Kernel, a.Initrd)
	if err != nil {
		return t, fmt.Errorf("build template %s: %w", id, err)
	}
	if st, err := os.Stat(a.Rootfs); err == nil {
		t.DiskMiB = int(st.Size() >> 20)
	}
	disk, finish, err := c.cfg.Disks.TemplateDisk(ctx, &t, a.Rootfs)
	if err != nil {
		return t, fmt.Errorf("build template %s: %w", id, err)
	}
	defer func() {
		if ferr := finish(ctx, err == nil); err == nil && ferr != nil {
			err = fmt.Errorf("build template %s: %w", id, ferr)
		}
	}()
	// Empty drive slots, so sandboxes of the template can bring drives.
	t.DriveSlots = sandbox.DriveSlots(c.cfg.VMs.Driver)
	return t, c.snapshotBoot(ctx, &t, disk, kernel, initrd)
}

// snapshotBoot boots t's first VM on disk, waits for its agent, and
// writes its snapshot (paused, then stopped).
func (c *Catalog) snapshotBoot(ctx context.Context, t *template.Template, disk sandbox.Disk, kernel, initrd string) error {
	id := t.ID
	vm, err := sandbox.Start(ctx, c.cfg.VMs, sandbox.Spec{
		ID: "template-" + id, RunDir: filepath.Join(t.Dir, "run"), Disk: disk, Drives: make([]sandbox.Disk, t.DriveSlots),
		Boot:      &vmm.Config{Kernel: kernel, Initrd: initrd, VCPUs: t.VCPUs, MemoryMiB: t.MemoryMiB, Cmdline: BootCmdline},
		AgentWait: 5 * time.Minute,
	})
	if err != nil {
		return fmt.Errorf("build template %s: %w", id, err)
	}
	defer vm.Close(context.WithoutCancel(ctx))
	if err := vm.Machine.Pause(ctx); err != nil {
		return fmt.Errorf("build template %s: pause: %w", id, err)
	}
	if _, err := vm.Machine.Snapshot(ctx, t.Snapshot); err != nil {
		return fmt.Errorf("build template %s: snapshot: %w", id, err)
	}
	if err := atomicfile.SyncTree(t.Snapshot); err != nil {
		return fmt.Errorf("build template %s: %w", id, err)
	}
	if err := vm.Stop(ctx); err != nil {
		return fmt.Errorf("build template %s: stop: %w", id, err)
	}
	slog.Debug("template snapshot written", "dir", t.Snapshot)
	return nil
}

// BootFiles finds the kernel and initrd of the nearest template in lineage
// that keeps them (a fromTemplate build keeps none: its parent's apply),
// else the node's default template's.
func (c *Catalog) BootFiles(lineage []*template.Template) (kernel, initrd string, err error) {
	dirs := make([]string, 0, len(lineage)+1)
	for _, t := range lineage {
		dirs = append(dirs, t.Dir)
	}
	if t, ok := c.ByID(template.DefaultID); ok {
		dirs = append(dirs, t.Dir)
	}
	for _, d := range dirs {
		k, i := filepath.Join(d, kernelFile), filepath.Join(d, initrdFile)
		if _, err := os.Stat(k); err != nil {
			continue
		}
		if _, err := os.Stat(i); err != nil {
			i = ""
		}
		return k, i, nil
	}
	return "", "", fmt.Errorf("no kernel in the directories of the templates it descends from: %w", errdefs.ErrConflict)
}

// Lineage lists the templates a template or snapshot id descends from,
// nearest first: a snapshot leads to the template (or snapshot) its
// sandbox was created from, a fromTemplate build to its parent. A cycle in
// the records ends the walk after 64 steps.
func (c *Catalog) Lineage(id string) []*template.Template {
	var out []*template.Template
	for range 64 {
		if t, ok := c.ByID(id); ok {
			out = append(out, t)
			if t.Parent == "" || t.Parent == id {
				break
			}
			id = t.Parent
			continue
		}
		var snap snapshot.Record
		if err := c.cfg.Store.Get(store.Snapshots, id, &snap); err != nil || snap.TemplateID == id {
			break
		}
		id = snap.TemplateID
	}
	return out
}
