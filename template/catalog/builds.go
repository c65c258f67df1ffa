package catalog

import (
	"context"
	"fmt"
	"io"
	"log/slog"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/template"
)

// Template builds run in package template; the catalog is its Host (the
// committed templates, with the node's root disks and memory images) and
// passes the API's build calls through.

// Builder returns the template builder; ErrInvalid before EnableBuilds
// or after CloseBuilds.
func (c *Catalog) Builder() (*template.Builder, error) {
	if b := c.builds.Load(); b != nil {
		return b, nil
	}
	return nil, fmt.Errorf("template builds are not enabled on this node: %w", errdefs.ErrInvalid)
}

// EnableBuilds starts the template builder: built templates in the store
// serve sandboxes, builds a previous run left unfinished are marked failed.
// log is the builder's logger.
func (c *Catalog) EnableBuilds(ctx context.Context, opt template.ImageOptions, log *slog.Logger) error {
	b, err := template.NewBuilder(ctx, template.Config{DataDir: c.cfg.DataDir, Store: c.cfg.Store, VMs: c.cfg.VMs,
		VCPUs: c.cfg.VCPUs, MemoryMiB: c.cfg.MemoryMiB, DefaultUser: c.cfg.DefaultUser, Image: opt, Logger: log},
		buildHost{c})
	if err != nil {
		return fmt.Errorf("enable builds: %w", err)
	}
	c.builds.Store(b)
	c.registerBuiltins(b)
	c.cfg.Node.Localize(ctx) // the templates are known now
	return nil
}

// CloseBuilds cancels a running build and waits for the builder to stop;
// build calls fail afterwards.
func (c *Catalog) CloseBuilds() {
	if b := c.builds.Swap(nil); b != nil {
		b.Close()
	}
}

// CreateTemplate registers a template (or a new build of the one its name
// names) with a build waiting for its spec.
func (c *Catalog) CreateTemplate(req template.Request) (template.Template, string, error) {
	b, err := c.Builder()
	if err != nil {
		return template.Template{}, "", err
	}
	return b.Create(req)
}

// StartBuild queues the build of a waiting build with spec.
func (c *Catalog) StartBuild(templateID, buildID string, spec template.BuildSpec) error {
	b, err := c.Builder()
	if err != nil {
		return err
	}
	return b.Start(templateID, buildID, spec)
}

// BuildStatus returns a build's status and a window of its log.
func (c *Catalog) BuildStatus(templateID, buildID string, offset, limit int, level string) (template.BuildStatus, error) {
	b, err := c.Builder()
	if err != nil {
		return template.BuildStatus{}, err
	}
	return b.Status(templateID, buildID, offset, limit, level)
}

// FilesPresent reports whether a COPY archive was uploaded.
func (c *Catalog) FilesPresent(templateID, hash string) (bool, error) {
	b, err := c.Builder()
	if err != nil {
		return false, err
	}
	return b.FilesPresent(templateID, hash)
}

// PutFiles stores a COPY archive under the client's key.
func (c *Catalog) PutFiles(ctx context.Context, templateID, hash string, r io.Reader) error {
	b, err := c.Builder()
	if err != nil {
		return err
	}
	return b.PutFiles(ctx, templateID, hash, r)
}

// buildHost is the catalog as the template builder sees it.
type buildHost struct{ c *Catalog }

func (h buildHost) Committed(idOrName string) (*template.Template, error) {
	return h.c.Template(idOrName)
}

// Publish serves a ready template here and runs the node's hooks for it.
func (h buildHost) Publish(t *template.Template) {
	h.c.Set(t)
	h.c.cfg.Node.Published(context.Background(), t)
}

func (h buildHost) BuildDisk(id, dir, imageConfig string) template.Disk {
	return h.c.cfg.Disks.BuildDisk(id, dir, imageConfig)
}

func (h buildHost) RestoreMemory(ctx context.Context, snapshotDir string) (string, error) {
	return h.c.cfg.Node.RestoreMemory(ctx, snapshotDir)
}
