// Package catalog is a node's catalog of templates: the committed
// templates that serve sandboxes (the node's default template, built once
// from the guest assets, and those template builds committed), looked up
// by id or name, registered, listed and deleted, the template builder's
// glue (package template runs the builds; the catalog is its Host), the
// lineage of a template or snapshot and the boot files a cold boot of its
// disk uses.
//
// The catalog is made once per node (by the orchestrator) and reaches the
// node only through its Node and Disks interfaces: it does not import the
// orchestrator.
package catalog

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/agentenv/agentenv/disk"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/store"
	"github.com/agentenv/agentenv/template"
)

// Node is what the catalog needs of the node it serves.
type Node interface {
	// List returns the node's sandboxes in any state (a template one of
	// them uses cannot be deleted).
	List() []sandbox.Record
	// ImportMemory gives a committed template's snapshot its layered
	// memory image (its memory file imported as the base layer).
	ImportMemory(t *template.Template) error
	// Pool keeps a registered template's VMM pool filled when the node's
	// configuration names it; Unpool drains it before its files go.
	Pool(t *template.Template)
	Unpool(ctx context.Context, id string)
	// Published runs the node's hooks for a template whose build committed
	// (the repository queues its commit).
	Published(ctx context.Context, t *template.Template)
	// RestoreMemory returns the memory file a VM restored from the VMM
	// snapshot directory maps ("" for the snapshot's own).
	RestoreMemory(ctx context.Context, snapshotDir string) (string, error)
	// Localize moves the remote layers of what the node knows onto local
	// files (called once builds are enabled and their templates known).
	Localize(ctx context.Context)
}

// Disks is what the catalog needs of the node's disks (a *disk.Manager).
type Disks interface {
	// TemplateDisk is the writable root disk of the default template's
	// first boot over the raw rootfs; finish commits or drops it.
	TemplateDisk(ctx context.Context, t *template.Template, raw string) (sandbox.Disk, func(ctx context.Context, commit bool) error, error)
	// BuildDisk is a build VM's root disk (template.Host).
	BuildDisk(id, dir, imageConfig string) template.Disk
	// Warm gives a committed template's root disks a warm pool.
	Warm(ctx context.Context, t *template.Template)
	// Forget stops the fetches of lazy layers into dir.
	Forget(dir string)
}

// Config configures a Catalog.
type Config struct {
	DataDir string
	Store   *store.Store
	// VMs is what the default template's first boot brings its VM up with.
	VMs sandbox.Deps
	// VCPUs, MemoryMiB and DefaultUser are the node's defaults.
	VCPUs, MemoryMiB int
	DefaultUser      string
	Disks            Disks
	Node             Node
	// Refs is held around a deletion's in-use check and removal; the
	// node's creates hold it while resolving their source and registering
	// the sandbox, so a deletion sees every sandbox that will use what it
	// deletes.
	Refs   sync.Locker
	Logger *slog.Logger
}

// Catalog is a node's templates.
type Catalog struct {
	cfg Config
	log *slog.Logger
	// mu guards templates, the committed templates by id. A registered
	// *template.Template is not changed afterwards (a new build registers
	// a new one), so readers may keep it after unlocking.
	mu        sync.Mutex
	templates map[string]*template.Template
	// builds is the template builder once EnableBuilds ran (builds.go).
	builds atomic.Pointer[template.Builder]
	// builtinMu serialises the starts of builtin templates' builds (builtin.go).
	builtinMu sync.Mutex
}

// New returns an empty catalog.
func New(cfg Config) *Catalog {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Catalog{cfg: cfg, log: cfg.Logger.With("component", "catalog"), templates: map[string]*template.Template{}}
}

// ByID returns a registered template (not a snapshot) by id.
func (c *Catalog) ByID(id string) (*template.Template, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.templates[id]
	return t, ok
}

// Find returns a registered template for which match holds (called with
// the catalog's lock held: it must not call the catalog).
func (c *Catalog) Find(match func(t *template.Template) bool) (*template.Template, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, t := range c.templates {
		if match(t) {
			return t, true
		}
	}
	return nil, false
}

// Template returns a committed template by id or by one of its names.
func (c *Catalog) Template(idOrName string) (*template.Template, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.templates[idOrName]
	if !ok {
		for _, cand := range c.templates {
			if slices.Contains(cand.Names, idOrName) {
				t, ok = cand, true
				break
			}
		}
	}
	if !ok {
		return nil, fmt.Errorf("template %q: %w", idOrName, errdefs.ErrNotFound)
	}
	return t, nil
}

// Templates lists the committed templates by id.
func (c *Catalog) Templates() []template.Template {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]template.Template, 0, len(c.templates))
	for _, t := range c.templates {
		out = append(out, *t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Set registers a committed (or building) template. A committed one is
// prepared first, here and not in a create: its memory imported as the
// base layer and its root disks given a warm pool.
func (c *Catalog) Set(t *template.Template) {
	ready := t.Status == "" || t.Status == template.BuildReady
	if ready {
		if _, err := os.Stat(t.Snapshot); err == nil {
			if err := c.cfg.Node.ImportMemory(t); err != nil {
				c.log.Warn("template memory stays unlayered", "template", t.ID, "err", err)
			}
			c.cfg.Disks.Warm(context.Background(), t)
		}
	}
	c.mu.Lock()
	c.templates[t.ID] = t
	c.mu.Unlock()
	if ready {
		c.cfg.Node.Pool(t) // once a fill finds it registered
	}
}

// All lists every template, the default and those waiting for or failing
// their build included, oldest first.
func (c *Catalog) All() []template.Template {
	byID := map[string]template.Template{}
	for _, t := range c.Templates() {
		byID[t.ID] = t
	}
	if b, err := c.Builder(); err == nil {
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

// Resolve finds any template (also one not built yet) by id or name.
func (c *Catalog) Resolve(idOrName string) (template.Template, error) {
	if b, err := c.Builder(); err == nil {
		if t, ok := b.Resolve(idOrName); ok {
			return t, nil
		}
	}
	t, err := c.Template(idOrName)
	if err != nil {
		return template.Template{}, err
	}
	return *t, nil
}

// Delete removes a template and its files. It refuses (ErrConflict) while
// a sandbox, in any state, was created from it, while it builds, or while
// another template was built from it; the default template cannot be
// deleted.
func (c *Catalog) Delete(ctx context.Context, idOrName string) error {
	b, err := c.Builder()
	if err != nil {
		return err
	}
	if t, err := c.Template(idOrName); err == nil && t.ID == template.DefaultID {
		return fmt.Errorf("template %s is the node's default template: %w", t.ID, errdefs.ErrConflict)
	}
	// Refs: no create resolves this template between the check and the delete.
	c.cfg.Refs.Lock()
	defer c.cfg.Refs.Unlock()
	return b.Delete(idOrName, func(t *template.Template) error {
		if err := c.users(t.ID); err != nil {
			return err
		}
		c.mu.Lock()
		delete(c.templates, t.ID)
		c.mu.Unlock()
		c.cfg.Node.Unpool(ctx, t.ID)
		// Its files go next: no fetch of its lazy layers may write there.
		c.cfg.Disks.Forget(filepath.Join(c.cfg.DataDir, "templates", t.ID))
		return nil
	})
}

// users fails with ErrConflict while a sandbox (in any state) or a
// snapshot was created from template id, or one of its drives was.
func (c *Catalog) users(id string) error {
	for _, r := range c.cfg.Node.List() {
		if r.TemplateID == id || disk.UsesImage(disk.PlainDrives(r.Drives), id) {
			return fmt.Errorf("template %s: sandbox %s (%s) uses it: %w", id, r.ID, r.State, errdefs.ErrConflict)
		}
	}
	snaps, err := store.ListAll[snapshot.Record](c.cfg.Store, store.Snapshots)
	if err != nil {
		return fmt.Errorf("template %s: list snapshots: %w", id, err)
	}
	for _, sn := range snaps {
		if sn.TemplateID == id || disk.UsesImage(sn.Drives, id) {
			return fmt.Errorf("template %s: snapshot %s was taken from one of its sandboxes: %w", id, sn.ID, errdefs.ErrConflict)
		}
	}
	return nil
}

// DefaultUser is the user a sandbox's commands run as: its template's
// final USER, else the node's default. A snapshot's sandboxes keep the
// user of the template it descends from.
func (c *Catalog) DefaultUser(templateID string) string {
	for range 64 {
		if t, ok := c.ByID(templateID); ok {
			if t.DefaultUser != "" {
				return t.DefaultUser
			}
			break
		}
		var snap snapshot.Record
		if err := c.cfg.Store.Get(store.Snapshots, templateID, &snap); err != nil || snap.TemplateID == templateID {
			break
		}
		templateID = snap.TemplateID
	}
	return c.cfg.DefaultUser
}
