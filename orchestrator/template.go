package orchestrator

import (
	"context"
	"io"

	"github.com/agentenv/agentenv/guest/image"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/template"
	"github.com/agentenv/agentenv/template/catalog"
)

// The node's templates live in package template/catalog (o.catalog, made
// in New); the methods here keep the API's calls on the orchestrator.

// newCatalog makes the node's catalog of templates (New, disks made).
func (o *Orchestrator) newCatalog() *catalog.Catalog {
	return catalog.New(catalog.Config{DataDir: o.cfg.DataDir, Store: o.store, VMs: o.vms, VCPUs: o.cfg.VCPUs,
		MemoryMiB: o.cfg.MemoryMiB, DefaultUser: o.cfg.DefaultUser, Disks: o.disks, Node: catalogNode{o},
		Refs: &o.refMu, Logger: o.cfg.Logger})
}

// catalogNode is the orchestrator as the catalog sees it (catalog.Node).
type catalogNode struct{ o *Orchestrator }

func (n catalogNode) List() []sandbox.Record                  { return n.o.List() }
func (n catalogNode) ImportMemory(t *template.Template) error { return n.o.ensureMemoryBase(t) }
func (n catalogNode) Pool(t *template.Template)               { n.o.poolTemplate(t) }
func (n catalogNode) Unpool(ctx context.Context, id string)   { n.o.unpoolTemplate(ctx, id) }
func (n catalogNode) Localize(ctx context.Context)            { n.o.localizeAll(ctx) }
func (n catalogNode) Published(ctx context.Context, t *template.Template) {
	n.o.afterTemplateReady(ctx, t)
}

func (n catalogNode) RestoreMemory(ctx context.Context, snapshotDir string) (string, error) {
	m, _, err := n.o.restoreMemory(ctx, snapshotDir, false)
	return m.File, err
}

// EnsureTemplate returns the default template, building it from the guest
// assets when the store has none (catalog.EnsureDefault).
func (o *Orchestrator) EnsureTemplate(ctx context.Context, assets *image.Assets) (*template.Template, error) {
	return o.catalog.EnsureDefault(ctx, assets)
}

// Template returns a committed template by id or name.
func (o *Orchestrator) Template(idOrName string) (*template.Template, error) {
	return o.catalog.Template(idOrName)
}

// Templates lists the committed templates.
func (o *Orchestrator) Templates() []template.Template { return o.catalog.Templates() }

// AllTemplates lists every template, the default and those waiting for or
// failing their build included, oldest first.
func (o *Orchestrator) AllTemplates() []template.Template { return o.catalog.All() }

// ResolveTemplate finds any template (also one not built yet) by id or name.
func (o *Orchestrator) ResolveTemplate(idOrName string) (template.Template, error) {
	return o.catalog.Resolve(idOrName)
}

// DeleteTemplate removes a template and its files; ErrConflict while
// anything uses it (catalog.Delete).
func (o *Orchestrator) DeleteTemplate(ctx context.Context, idOrName string) error {
	return o.catalog.Delete(ctx, idOrName)
}

// EnableBuilds starts the template builder: built templates in the store
// serve sandboxes, builds a previous run left unfinished are marked failed.
func (o *Orchestrator) EnableBuilds(ctx context.Context, opt template.ImageOptions) error {
	return o.catalog.EnableBuilds(ctx, opt, o.cfg.Logger)
}

// CloseBuilds cancels a running build and waits for the builder to stop;
// build calls fail afterwards.
func (o *Orchestrator) CloseBuilds() { o.catalog.CloseBuilds() }

// CreateTemplate registers a template (or a new build of the one its name
// names) with a build waiting for its spec.
func (o *Orchestrator) CreateTemplate(req template.Request) (template.Template, string, error) {
	return o.catalog.CreateTemplate(req)
}

// StartBuild queues the build of a waiting build with spec.
func (o *Orchestrator) StartBuild(templateID, buildID string, spec template.BuildSpec) error {
	return o.catalog.StartBuild(templateID, buildID, spec)
}

// BuildStatusOf returns a build's status and a window of its log.
func (o *Orchestrator) BuildStatusOf(templateID, buildID string, offset, limit int, level string) (template.BuildStatus, error) {
	return o.catalog.BuildStatus(templateID, buildID, offset, limit, level)
}

// TemplateFilesPresent reports whether a COPY archive was uploaded.
func (o *Orchestrator) TemplateFilesPresent(templateID, hash string) (bool, error) {
	return o.catalog.FilesPresent(templateID, hash)
}

// PutTemplateFiles stores a COPY archive under the client's files key.
func (o *Orchestrator) PutTemplateFiles(ctx context.Context, templateID, hash string, r io.Reader) error {
	return o.catalog.PutFiles(ctx, templateID, hash, r)
}
