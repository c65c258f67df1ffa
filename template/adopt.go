package template

// Templates committed by another node: a node sharing a snapshot repository
// brings a template it never built (its layers, VMM snapshot and record) and
// adopts it here. Its files are written first, under
// data_dir/templates/<id>; the record is stored last, so a crash in between
// leaves a directory no record owns, which the next start removes.

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/store"
)

// BuildDir is where a build's files live (the layout imported templates
// follow too).
func (b *Builder) BuildDir(templateID, buildID string) string { return b.buildDir(templateID, buildID) }

// Adopt records a ready template brought from the repository, whose files
// are in place, and publishes it. Refused (ErrConflict) when this node has
// a template of that id or one of its names.
func (b *Builder) Adopt(t *Template) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.recs[t.ID] != nil {
		return fmt.Errorf("template %s: this node has one of that id: %w", t.ID, errdefs.ErrConflict)
	}
	for _, n := range t.Names {
		if o := b.resolve(n); o != nil {
			return fmt.Errorf("template %s: name %q is template %s's here: %w", t.ID, n, o.ID, errdefs.ErrConflict)
		}
	}
	if err := b.cfg.Store.Put(store.Templates, t.ID, t); err != nil {
		return fmt.Errorf("record template %s: %w", t.ID, err)
	}
	b.recs[t.ID] = t
	b.host.Publish(t.Clone())
	b.log.Info("template adopted from the repository", "template", t.ID, "build", t.BuildID, "from", t.Origin)
	return nil
}

// sweepUnrecorded removes template directories no record owns (an import
// that crashed before its record). The default template is left alone: it
// is built before its record exists, by the orchestrator, not here.
func (b *Builder) sweepUnrecorded() {
	dirs, _ := os.ReadDir(filepath.Join(b.cfg.DataDir, "templates"))
	for _, d := range dirs {
		if !d.IsDir() || d.Name() == DefaultID || b.recs[d.Name()] != nil {
			continue
		}
		path := filepath.Join(b.cfg.DataDir, "templates", d.Name())
		if err := os.RemoveAll(path); err != nil {
			b.log.Warn("remove template files no record owns", "dir", path, "err", err)
			continue
		}
		b.log.Info("removed template files no record owns", "dir", path)
	}
}
