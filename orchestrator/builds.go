package orchestrator

import (
	"context"
	"fmt"
	"io"
	"slices"

	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/store"
	"github.com/agentenv/agentenv/template"
)

// Template builds run in package template; the orchestrator is its Host
// (the catalog of committed templates, root disks, memory images) and
// passes the API's build calls through.

func (o *Orchestrator) builder() (*template.Builder, error) {
	if b := o.builds.Load(); b != nil {
		return b, nil
	}
	return nil, fmt.Errorf("template builds are not enabled on this node: %w", ErrInvalid)
}

// EnableBuilds starts the template builder: built templates in the store
// serve sandboxes, builds a previous run left unfinished are marked failed.
func (o *Orchestrator) EnableBuilds(ctx context.Context, opt template.ImageOptions) error {
	b, err := template.NewBuilder(ctx, template.Config{DataDir: o.cfg.DataDir, Store: o.store, VMs: o.vms,
		VCPUs: o.cfg.VCPUs, MemoryMiB: o.cfg.MemoryMiB, DefaultUser: o.cfg.DefaultUser, Image: opt, Logger: o.cfg.Logger},
		buildHost{o})
	if err != nil {
		return fmt.Errorf("enable builds: %w", err)
	}
	o.builds.Store(b)
	o.localizeAll(ctx) // the templates are known now
	return nil
}

// CloseBuilds cancels a running build and waits for the builder to stop;
// build calls fail afterwards.
func (o *Orchestrator) CloseBuilds() {
	if b := o.builds.Swap(nil); b != nil {
		b.Close()
	}
}

// CreateTemplate registers a template (or a new build of the one its name
// names) with a build waiting for its spec.
func (o *Orchestrator) CreateTemplate(req template.Request) (template.Template, string, error) {
	b, err := o.builder()
	if err != nil {
		return template.Template{}, "", err
	}
	return b.Create(req)
}

// StartBuild queues the build of a waiting build with spec.
func (o *Orchestrator) StartBuild(templateID, buildID string, spec template.BuildSpec) error {
	b, err := o.builder()
	if err != nil {
		return err
	}
	return b.Start(templateID, buildID, spec)
}

// BuildStatusOf returns a build's status and a window of its log.
func (o *Orchestrator) BuildStatusOf(templateID, buildID string, offset, limit int, level string) (template.BuildStatus, error) {
	b, err := o.builder()
	if err != nil {
		return template.BuildStatus{}, err
	}
	return b.Status(templateID, buildID, offset, limit, level)
}

// TemplateFilesPresent reports whether a COPY archive was uploaded.
func (o *Orchestrator) TemplateFilesPresent(templateID, hash string) (bool, error) {
	b, err := o.builder()
	if err != nil {
		return false, err
	}
	return b.FilesPresent(templateID, hash)
}

// PutTemplateFiles stores a COPY archive checked against its SHA-256.
func (o *Orchestrator) PutTemplateFiles(ctx context.Context, templateID, hash string, r io.Reader) error {
	b, err := o.builder()
	if err != nil {
		return err
	}
	return b.PutFiles(ctx, templateID, hash, r)
}

// buildHost is the orchestrator as the template builder sees it.
type buildHost struct{ o *Orchestrator }

func (h buildHost) Committed(idOrName string) (*template.Template, error) {
	return h.o.Template(idOrName)
}

// Publish serves a ready template here and runs the TemplateReady hooks
// (the repository queues its commit).
func (h buildHost) Publish(t *template.Template) {
	h.o.setTemplate(t)
	h.o.afterTemplateReady(context.Background(), t)
}

func (h buildHost) BuildDisk(id, dir, imageConfig string) template.Disk {
	return h.o.disks.BuildDisk(id, dir, imageConfig)
}

func (h buildHost) RestoreMemory(ctx context.Context, snapshotDir string) (string, error) {
	m, _, err := h.o.restoreMemory(ctx, snapshotDir, false)
	return m.File, err
}

// templateByName finds a committed template by one of its names; o.mu must
// be held.
func (o *Orchestrator) templateByName(name string) (*template.Template, bool) {
	for _, t := range o.templates {
		if slices.Contains(t.Names, name) {
			return t, true
		}
	}
	return nil, false
}

// defaultUser is the user a sandbox's commands run as: its template's final
// USER, else the node's default. A snapshot's sandboxes keep the user of the
// template it descends from.
func (o *Orchestrator) defaultUser(templateID string) string {
	for range 64 {
		o.mu.Lock()
		t, ok := o.templates[templateID]
		o.mu.Unlock()
		if ok {
			if t.DefaultUser != "" {
				return t.DefaultUser
			}
			break
		}
		var snap snapshot.Record
		if err := o.store.Get(store.Snapshots, templateID, &snap); err != nil || snap.TemplateID == templateID {
			break
		}
		templateID = snap.TemplateID
	}
	return o.cfg.DefaultUser
}
