package orchestrator

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/agentenv/agentenv/guest/image"
	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/store"
	"github.com/agentenv/agentenv/vmm"
)

// DefaultTemplate is the template built from the guest assets at first start.
const DefaultTemplate = "base"

// Template is a committed snapshot sandboxes are created from.
type Template struct {
	ID       string `json:"id"`
	Dir      string `json:"dir"`              // templates/<id>
	Snapshot string `json:"snapshot"`         // <dir>/snapshot
	Rootfs   string `json:"rootfs,omitempty"` // file mode: <dir>/rootfs.ext4, the disk as of the snapshot
	// RootfsImage (daemon mode) is the image config of the disk as of the
	// snapshot: the imported base layer and the sealed boot upper.
	RootfsImage string    `json:"rootfsImage,omitempty"`
	VCPUs       int       `json:"vcpus"`
	MemoryMiB   int       `json:"memoryMiB"`
	DiskMiB     int       `json:"diskMiB"`
	EnvdVersion string    `json:"envdVersion"`
	CreatedAt   time.Time `json:"createdAt"`
	// GuestToken is the access token the snapshot's agent holds (a snapshot
	// of a secure sandbox seen as a template; templates have none).
	GuestToken string `json:"-"`

	// Built templates (build.go). Names are the template's names (E2B's
	// aliases), usable instead of its id. Status is "" or ready once a build
	// committed a snapshot; waiting, building or error before that.
	Names       []string                `json:"names,omitempty"`
	Tags        []string                `json:"tags,omitempty"`
	Status      string                  `json:"status,omitempty"`
	BuildID     string                  `json:"buildID,omitempty"`     // the build the snapshot comes from
	LatestBuild string                  `json:"latestBuild,omitempty"` // the newest build
	Builds      map[string]*BuildRecord `json:"builds,omitempty"`
	// Parent is the template a fromTemplate build restored (its snapshot
	// files are shared).
	Parent string `json:"parent,omitempty"`
	// DefaultUser, DefaultWorkdir and Env are the final USER, WORKDIR and
	// ENV of the build, set in the agent before the snapshot.
	DefaultUser    string            `json:"defaultUser,omitempty"`
	DefaultWorkdir string            `json:"defaultWorkdir,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	UpdatedAt      time.Time         `json:"updatedAt,omitzero"`
}

// EnsureTemplate returns the default template, building it from the guest
// assets when the store has none: cold boot (writable copy of the rootfs),
// wait for the agent, pause, snapshot, stop, commit.
func (o *Orchestrator) EnsureTemplate(ctx context.Context, assets *image.Assets) (*Template, error) {
	var t Template
	if err := o.store.Get(store.Templates, DefaultTemplate, &t); err == nil {
		if (o.sd != nil) != (t.RootfsImage != "") {
			return nil, fmt.Errorf("template %s was built for the other storage backend (daemon: %v); use that backend or a fresh data_dir",
				t.ID, t.RootfsImage != "")
		}
		o.setTemplate(&t)
		return &t, nil
	}
	start := time.Now()
	t, err := o.buildTemplate(ctx, DefaultTemplate, assets)
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
func (o *Orchestrator) setTemplate(t *Template) {
	if t.Status == "" || t.Status == BuildReady {
		if _, err := os.Stat(t.Snapshot); err == nil {
			if err := o.ensureMemoryBase(t); err != nil {
				o.log.Warn("template memory stays unlayered", "template", t.ID, "err", err)
			}
			o.disks.warm(context.Background(), t)
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.templates[t.ID] = t
}

func (o *Orchestrator) buildTemplate(ctx context.Context, id string, a *image.Assets) (t Template, err error) {
	dir := filepath.Join(o.cfg.DataDir, "templates", id)
	if err := os.RemoveAll(dir); err != nil { // a half-built leftover
		return t, fmt.Errorf("build template %s: %w", id, err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return t, fmt.Errorf("build template %s: %w", id, err)
	}
	t = Template{ID: id, Dir: dir, Snapshot: filepath.Join(dir, "snapshot"),
		VCPUs: o.cfg.VCPUs, MemoryMiB: o.cfg.MemoryMiB, EnvdVersion: envdVersion, CreatedAt: time.Now().UTC()}
	// Kernel and initrd are copied so the template outlives the asset cache
	// (the snapshot's config names them).
	kernel, initrd := filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initrd.cpio")
	for src, dst := range map[string]string{a.Kernel: kernel, a.Initrd: initrd} {
		if err := snapshot.SparseCopy(ctx, src, dst); err != nil {
			return t, fmt.Errorf("build template %s: %w", id, err)
		}
	}
	if st, err := os.Stat(a.Rootfs); err == nil {
		t.DiskMiB = int(st.Size() >> 20)
	}
	drive, finish, err := o.disks.templateDisk(ctx, &t, a.Rootfs)
	if err != nil {
		return t, fmt.Errorf("build template %s: %w", id, err)
	}
	defer func() {
		if ferr := finish(ctx, err == nil); err == nil && ferr != nil {
			err = fmt.Errorf("build template %s: %w", id, ferr)
		}
	}()
	vm, err := sandbox.Start(ctx, o.vms, sandbox.Spec{
		ID: "template-" + id, RunDir: filepath.Join(dir, "run"), Disk: preparedDisk{drive},
		Boot:      &vmm.Config{Kernel: kernel, Initrd: initrd, VCPUs: t.VCPUs, MemoryMiB: t.MemoryMiB, Cmdline: "root=/dev/vda rw quiet"},
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

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// AllTemplates lists every template, the default and those waiting for or
// failing their build included, oldest first.
func (o *Orchestrator) AllTemplates() []Template {
	byID := map[string]Template{}
	for _, t := range o.Templates() {
		byID[t.ID] = t
	}
	if b, err := o.builder(); err == nil {
		b.mu.Lock()
		for _, t := range b.recs {
			if _, ok := byID[t.ID]; !ok || t.ready() {
				byID[t.ID] = *t.clone()
			}
		}
		b.mu.Unlock()
	}
	out := make([]Template, 0, len(byID))
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
func (o *Orchestrator) ResolveTemplate(idOrName string) (Template, error) {
	if b, err := o.builder(); err == nil {
		b.mu.Lock()
		t := b.resolve(idOrName)
		var c Template
		if t != nil {
			c = *t.clone()
		}
		b.mu.Unlock()
		if t != nil {
			return c, nil
		}
	}
	t, err := o.Template(idOrName)
	if err != nil {
		return Template{}, err
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
	b.mu.Lock()
	defer b.mu.Unlock()
	// refMu: no create resolves this template between the check and the delete.
	o.refMu.Lock()
	defer o.refMu.Unlock()
	t := b.resolve(idOrName)
	if t == nil {
		if _, err := o.Template(idOrName); err == nil && idOrName == DefaultTemplate {
			return fmt.Errorf("template %s is the node's default template: %w", idOrName, ErrConflict)
		}
		return fmt.Errorf("template %q: %w", idOrName, ErrNotFound)
	}
	if t.ID == DefaultTemplate {
		return fmt.Errorf("template %s is the node's default template: %w", t.ID, ErrConflict)
	}
	for _, br := range t.Builds {
		if br.Status == BuildBuilding {
			return fmt.Errorf("template %s: build %s is running: %w", t.ID, br.ID, ErrConflict)
		}
	}
	for _, r := range o.List() {
		if r.TemplateID == t.ID {
			return fmt.Errorf("template %s: sandbox %s (%s) uses it: %w", t.ID, r.ID, r.State, ErrConflict)
		}
	}
	snaps, err := store.ListAll[snapshot.Record](o.store, store.Snapshots)
	if err != nil {
		return err
	}
	for _, sn := range snaps {
		if sn.TemplateID == t.ID {
			return fmt.Errorf("template %s: snapshot %s was taken from one of its sandboxes: %w", t.ID, sn.ID, ErrConflict)
		}
	}
	for _, other := range b.recs {
		if other.ID != t.ID && other.Parent == t.ID {
			return fmt.Errorf("template %s: template %s was built from it: %w", t.ID, other.ID, ErrConflict)
		}
	}
	o.mu.Lock()
	delete(o.templates, t.ID)
	o.mu.Unlock()
	if err := o.store.Delete(store.Templates, t.ID); err != nil {
		return err
	}
	delete(b.recs, t.ID)
	for id := range t.Builds {
		delete(b.logs, id)
	}
	if err := os.RemoveAll(filepath.Join(o.cfg.DataDir, "templates", t.ID)); err != nil {
		o.log.Warn("remove template files", "template", t.ID, "err", err)
	}
	o.log.Info("template deleted", "template", t.ID)
	return nil
}
