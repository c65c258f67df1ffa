package orchestrator

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/agentenv/agentenv/disk"
	"github.com/agentenv/agentenv/guest/image"
	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/store"
	"github.com/agentenv/agentenv/template"
	"github.com/agentenv/agentenv/vmm"
)

// EnsureTemplate returns the default template, building it from the guest
// assets when the store has none: cold boot (writable copy of the rootfs),
// wait for the agent, pause, snapshot, stop, commit.
func (o *Orchestrator) EnsureTemplate(ctx context.Context, assets *image.Assets) (*template.Template, error) {
	var t template.Template
	if err := o.store.Get(store.Templates, template.DefaultID, &t); err == nil && t.RootfsImage != "" {
		o.setTemplate(&t)
		return &t, nil
	} else if err == nil {
		o.log.Warn("the default template was built on file disks, which nodes no longer keep; building it again", "template", t.ID)
	}
	start := time.Now()
	t, err := o.buildTemplate(ctx, template.DefaultID, assets)
	if err != nil {
		return nil, err
	}
	if err := o.store.Put(store.Templates, t.ID, t); err != nil {
		return nil, err
	}
	o.setTemplate(&t)
	o.log.Info("template built", "template", t.ID, "took", time.Since(start).Round(time.Millisecond))
	return &t, nil
}

// setTemplate registers a committed (or building) template. A committed
// one is prepared first, here and not in a create: its memory imported as
// the base layer and its root disks given a warm pool.
func (o *Orchestrator) setTemplate(t *template.Template) {
	if t.Status == "" || t.Status == template.BuildReady {
		if _, err := os.Stat(t.Snapshot); err == nil {
			if err := o.ensureMemoryBase(t); err != nil {
				o.log.Warn("template memory stays unlayered", "template", t.ID, "err", err)
			}
			o.disks.Warm(context.Background(), t)
		}
	}
	o.mu.Lock()
	o.templates[t.ID] = t
	o.mu.Unlock()
	if t.Status == "" || t.Status == template.BuildReady {
		o.poolTemplate(t) // once a fill finds it registered
	}
}

func (o *Orchestrator) buildTemplate(ctx context.Context, id string, a *image.Assets) (t template.Template, err error) {
	dir := filepath.Join(o.cfg.DataDir, "templates", id)
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
		VCPUs: o.cfg.VCPUs, MemoryMiB: o.cfg.MemoryMiB, EnvdVersion: template.AgentVersion, CreatedAt: time.Now().UTC()}
	// Kernel and initrd are copied so the template outlives the asset cache
	// (the snapshot's config names them).
	kernel, initrd := filepath.Join(dir, kernelFile), filepath.Join(dir, initrdFile)
	for src, dst := range map[string]string{a.Kernel: kernel, a.Initrd: initrd} {
		if err := snapshot.SparseCopy(ctx, src, dst); err != nil {
			return t, fmt.Errorf("build template %s: %w", id, err)
		}
	}
	if st, err := os.Stat(a.Rootfs); err == nil {
		t.DiskMiB = int(st.Size() >> 20)
	}
	disk, finish, err := o.disks.TemplateDisk(ctx, &t, a.Rootfs)
	if err != nil {
		return t, fmt.Errorf("build template %s: %w", id, err)
	}
	defer func() {
		if ferr := finish(ctx, err == nil); err == nil && ferr != nil {
			err = fmt.Errorf("build template %s: %w", id, ferr)
		}
	}()
	// Empty drive slots, so sandboxes of the template can bring drives.
	t.DriveSlots = sandbox.DriveSlots(o.vms.Driver)
	vm, err := sandbox.Start(ctx, o.vms, sandbox.Spec{
		ID: "template-" + id, RunDir: filepath.Join(dir, "run"), Disk: disk, Drives: make([]sandbox.Disk, t.DriveSlots),
		Boot:      &vmm.Config{Kernel: kernel, Initrd: initrd, VCPUs: t.VCPUs, MemoryMiB: t.MemoryMiB, Cmdline: bootCmdline},
		AgentWait: 5 * time.Minute,
	})
	if err != nil {
		return t, fmt.Errorf("build template %s: %w", id, err)
	}
	defer vm.Close(context.WithoutCancel(ctx))
	if err := vm.Machine.Pause(ctx); err != nil {
		return t, fmt.Errorf("build template %s: pause: %w", id, err)
	}
	if _, err := vm.Machine.Snapshot(ctx, t.Snapshot); err != nil {
		return t, fmt.Errorf("build template %s: snapshot: %w", id, err)
	}
	if err := atomicfile.SyncTree(t.Snapshot); err != nil {
		return t, fmt.Errorf("build template %s: %w", id, err)
	}
	if err := vm.Stop(ctx); err != nil {
		return t, fmt.Errorf("build template %s: stop: %w", id, err)
	}
	slog.Debug("template snapshot written", "dir", t.Snapshot)
	return t, nil
}

// AllTemplates lists every template, the default and those waiting for or
// failing their build included, oldest first.
func (o *Orchestrator) AllTemplates() []template.Template {
	byID := map[string]template.Template{}
	for _, t := range o.Templates() {
		byID[t.ID] = t
	}
	if b, err := o.builder(); err == nil {
		for _, t := range b.All() {
			if _, ok := byID[t.ID]; !ok || t.Ready() {
				byID[t.ID] = t
			}
		}
	}
	out := make([]template.Template, 0, len(byID))
	for _, t := range byID {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// ResolveTemplate finds any template (also one not built yet) by id or name.
func (o *Orchestrator) ResolveTemplate(idOrName string) (template.Template, error) {
	if b, err := o.builder(); err == nil {
		if t, ok := b.Resolve(idOrName); ok {
			return t, nil
		}
	}
	t, err := o.Template(idOrName)
	if err != nil {
		return template.Template{}, err
	}
	return *t, nil
}

// DeleteTemplate removes a template and its files. It refuses (ErrConflict)
// while a sandbox, in any state, was created from it, while it builds, or
// while another template was built from it; the default template cannot be
// deleted.
func (o *Orchestrator) DeleteTemplate(ctx context.Context, idOrName string) error {
	b, err := o.builder()
	if err != nil {
		return err
	}
	if t, err := o.Template(idOrName); err == nil && t.ID == template.DefaultID {
		return fmt.Errorf("template %s is the node's default template: %w", t.ID, ErrConflict)
	}
	// refMu: no create resolves this template between the check and the delete.
	o.refMu.Lock()
	defer o.refMu.Unlock()
	return b.Delete(idOrName, func(t *template.Template) error {
		if err := o.templateUser(t.ID); err != nil {
			return err
		}
		o.mu.Lock()
		delete(o.templates, t.ID)
		o.mu.Unlock()
		o.unpoolTemplate(ctx, t.ID)
		// Its files go next: no fetch of its lazy layers may write there.
		o.disks.Forget(filepath.Join(o.cfg.DataDir, "templates", t.ID))
		return nil
	})
}

// templateUser fails with ErrConflict while a sandbox (in any state) or a
// snapshot was created from template id.
func (o *Orchestrator) templateUser(id string) error {
	for _, r := range o.List() {
		if r.TemplateID == id || disk.UsesImage(disk.PlainDrives(r.Drives), id) {
			return fmt.Errorf("template %s: sandbox %s (%s) uses it: %w", id, r.ID, r.State, ErrConflict)
		}
	}
	snaps, err := store.ListAll[snapshot.Record](o.store, store.Snapshots)
	if err != nil {
		return fmt.Errorf("template %s: list snapshots: %w", id, err)
	}
	for _, sn := range snaps {
		if sn.TemplateID == id || disk.UsesImage(sn.Drives, id) {
			return fmt.Errorf("template %s: snapshot %s was taken from one of its sandboxes: %w", id, sn.ID, ErrConflict)
		}
	}
	return nil
}
