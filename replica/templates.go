package replica

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/template"
)

// Built templates in the snapshot repository: a build's template, once its
// record says ready, is committed like a snapshot (its sealed rootfs and
// memory layers, VM state, and a portable config: the template's record and
// VMM config) under the manifest template-<id>-<build>, uploaded in the
// background. The queue is durable and a ready template is queued again at
// every start (a job already queued is left as it is), so a crash between
// the record and the queue only delays the commit (the node's hook once a
// template serves here). A node that shares the
// repository and has no template of that id or name brings the newest
// build's manifest at a create: layers fetched and verified, the VMM
// snapshot relocated to this node's boot files, the record stored last
// (template.Builder.Adopt). The default template is every node's own, built
// from its guest assets at start, and never committed or brought.

var (
	fpTemplateReady   = failpoint.New("orchestrator/repository/template-ready") // the template's record is ready, its commit not queued
	fpTemplateFetched = failpoint.New("orchestrator/import/template-fetched")   // a brought template's files are here, its record not yet
)

// maxTemplateScan bounds the template manifests a create by an unknown name
// reads to find the template carrying it.
const maxTemplateScan = 256

// ManifestOfTemplate names the repository manifest of a template's build.
func ManifestOfTemplate(id, buildID string) string { return "template-" + id + "-" + buildID }

// portableTemplate is the config blob of a template's manifest.
type portableTemplate struct {
	Template template.Template `json:"template"`
	VMM      json.RawMessage   `json:"vmm"`
}

// CommitTemplate (the node's hook once a template serves here) queues the
// upload of a ready built template (layered disks only). A failure to
// queue is logged: the template serves here.
func (r *Replica) CommitTemplate(ctx context.Context, t *template.Template) {
	if r.cfg.Uploads == nil || t.RootfsImage == "" || t.ID == template.DefaultID || t.Origin != "" ||
		!t.Ready() || t.BuildID == "" || t.Snapshot == "" {
		return
	}
	if err := fpTemplateReady.Inject(); err != nil {
		r.log.Warn("queue template commit", "template", t.ID, "err", err)
		return
	}
	j, err := uploadJob(ManifestOfTemplate(t.ID, t.BuildID), t.Parent, t.Snapshot, t.RootfsImage)
	j.Kind = repo.KindTemplate
	if err == nil {
		j.Config, err = writePortableTemplate(t, j.Config)
	}
	r.queue(ctx, j, err)
}

func writePortableTemplate(t *template.Template, vmmConfig string) (string, error) {
	raw, err := os.ReadFile(vmmConfig)
	if err != nil {
		return "", fmt.Errorf("portable config of template %s: %w", t.ID, err)
	}
	p := portableTemplate{Template: *t.Clone(), VMM: raw}
	// Only the build that made the snapshot travels (its logs stay here).
	p.Template.Builds = map[string]*template.BuildRecord{}
	if br := t.Builds[t.BuildID]; br != nil {
		c := *br
		p.Template.Builds[t.BuildID] = &c
	}
	b, err := json.Marshal(p)
	if err != nil {
		return "", fmt.Errorf("portable config of template %s: %w", t.ID, err)
	}
	path := filepath.Join(filepath.Dir(t.Snapshot), "template.json")
	if err := atomicfile.WriteFile(path, b, 0o600); err != nil {
		return "", fmt.Errorf("portable config of template %s: %w", t.ID, err)
	}
	return path, nil
}

// ImportTemplate (the node's hook before a create resolves a source it
// does not know, after ImportSnapshot found none) brings the template
// idOrName (its id, or one of its names), committed by another node, here.
// ErrNotFound when the repository has none; the caller holds no lock.
func (r *Replica) ImportTemplate(ctx context.Context, idOrName string) error {
	b, err := r.node.Builder()
	if r.cfg.Remote == nil || err != nil || idOrName == template.DefaultID || repo.ValidName(idOrName) != nil {
		return fmt.Errorf("template %q: %w", idOrName, errdefs.ErrNotFound)
	}
	r.importMu.Lock()
	defer r.importMu.Unlock()
	return r.importTemplateLocked(ctx, b, idOrName)
}

// templateOf returns the template id a brought sandbox or snapshot was
// created from, bringing it too when this node lacks it (importMu held).
func (r *Replica) templateOf(ctx context.Context, id string) (*template.Template, error) {
	t, err := r.node.Template(id)
	if !errors.Is(err, errdefs.ErrNotFound) {
		return t, err
	}
	if b, berr := r.node.Builder(); berr == nil && id != template.DefaultID {
		if ierr := r.importTemplateLocked(ctx, b, id); ierr != nil && !errors.Is(ierr, errdefs.ErrNotFound) {
			return nil, ierr
		}
	}
	return r.node.Template(id)
}

// importTemplateLocked is importTemplate with importMu held.
func (r *Replica) importTemplateLocked(ctx context.Context, b *template.Builder, idOrName string) error {
	if _, err := r.node.Template(idOrName); err == nil {
		return nil // brought by a concurrent create
	}
	m, p, err := r.findTemplate(ctx, idOrName)
	if err != nil {
		return err
	}
	// A record here of that id or a name of it, in any state, keeps its
	// files: nothing is fetched (Adopt checks again, under its lock).
	for _, n := range append([]string{p.Template.ID}, p.Template.Names...) {
		if local, ok := b.Resolve(n); ok {
			return fmt.Errorf("bring template %s (%s): %q is template %s's here: %w", idOrName, m.Name, n, local.ID, errdefs.ErrConflict)
		}
	}
	t, err := r.rebuildTemplate(ctx, b, m, p)
	if err == nil {
		err = fpTemplateFetched.Inject()
	}
	if err == nil {
		err = b.Adopt(t)
	}
	if err != nil {
		_ = os.RemoveAll(filepath.Join(r.cfg.DataDir, "templates", p.Template.ID))
		return fmt.Errorf("bring template %s from the repository (%s): %w", idOrName, m.Name, err)
	}
	r.log.Info("template brought from the repository", "template", t.ID, "manifest", m.Name)
	return nil
}

// findTemplate returns the newest build's manifest of the template whose id
// is idOrName, else of the one carrying the name, with its portable config.
func (r *Replica) findTemplate(ctx context.Context, idOrName string) (*repo.Manifest, portableTemplate, error) {
	names, err := r.cfg.Remote.Manifests(ctx)
	if err != nil {
		return nil, portableTemplate{}, fmt.Errorf("template %s: list the repository: %w", idOrName, err)
	}
	byID := map[string][]string{} // template id -> its build manifests
	for _, n := range names {
		id, _, ok := strings.Cut(strings.TrimPrefix(n, "template-"), "-")
		if ok && strings.HasPrefix(n, "template-") && validID(id) {
			byID[id] = append(byID[id], n)
		}
	}
	if ms, ok := byID[idOrName]; ok {
		return r.newestTemplate(ctx, idOrName, ms)
	}
	scanned := 0
	for id, ms := range byID {
		if scanned++; scanned > maxTemplateScan {
			break
		}
		m, p, err := r.newestTemplate(ctx, id, ms)
		if err != nil {
			r.log.Warn("template manifest unreadable", "template", id, "err", err)
			continue
		}
		for _, n := range p.Template.Names {
			if n == idOrName {
				return m, p, nil
			}
		}
	}
	return nil, portableTemplate{}, fmt.Errorf("template or snapshot %q: %w", idOrName, errdefs.ErrNotFound)
}

// newestTemplate reads template id's build manifests ms and returns the
// newest with its portable config.
func (r *Replica) newestTemplate(ctx context.Context, id string, ms []string) (*repo.Manifest, portableTemplate, error) {
	var best *repo.Manifest
	for _, n := range ms {
		m, err := r.cfg.Remote.Manifest(ctx, n)
		if err != nil {
			return nil, portableTemplate{}, fmt.Errorf("template %s: manifest %s: %w", id, n, err)
		}
		if m.Kind == repo.KindTemplate && (best == nil || m.Created.After(best.Created)) {
			best = m
		}
	}
	if best == nil {
		return nil, portableTemplate{}, fmt.Errorf("template %q: %w", id, errdefs.ErrNotFound)
	}
	raw, err := r.cfg.Remote.ReadSmall(ctx, best.Config, maxPortable)
	if err != nil {
		return nil, portableTemplate{}, fmt.Errorf("template %s: %w", id, err)
	}
	var p portableTemplate
	if err := json.Unmarshal(raw, &p); err != nil || p.Template.ID != id || len(p.VMM) == 0 ||
		best.Name != ManifestOfTemplate(id, p.Template.BuildID) {
		return nil, portableTemplate{}, fmt.Errorf("template %s: config blob %s is not this template's (%v)", id, best.Config.Digest, err)
	}
	return best, p, nil
}

// rebuildTemplate fetches the manifest's files into the build's directory
// here and returns the template's record, pointing at them.
func (r *Replica) rebuildTemplate(ctx context.Context, b *template.Builder, m *repo.Manifest, p portableTemplate) (*template.Template, error) {
	base, err := r.node.Template(template.DefaultID)
	if err != nil {
		return nil, fmt.Errorf("this node's default template (the boot files): %w", err)
	}
	t := p.Template.Clone()
	// A leftover of a crashed import (the record is stored last).
	if err := os.RemoveAll(filepath.Join(r.cfg.DataDir, "templates", t.ID)); err != nil {
		return nil, err
	}
	t.Dir = b.BuildDir(t.ID, t.BuildID)
	t.Snapshot, t.RootfsImage, t.Rootfs = filepath.Join(t.Dir, "snapshot"), filepath.Join(t.Dir, "rootfs.json"), ""
	t.Origin, t.Status, t.LatestBuild = m.Name, template.BuildReady, t.BuildID
	if br := t.Builds[t.BuildID]; br != nil {
		br.PID = 0
	}
	if err := os.MkdirAll(t.Dir, 0o700); err != nil {
		return nil, err
	}
	rootfs, err := r.lazyRefs(ctx, m.Rootfs, t.Dir, repo.UseRootfs)
	if err != nil {
		return nil, err
	}
	if err := snapshot.WriteImageConfig(t.RootfsImage, rootfs); err != nil {
		return nil, err
	}
	r.node.FetchLater(t.RootfsImage)
	mem, err := r.fetchAll(ctx, m.Memory, t.Dir)
	if err != nil {
		return nil, err
	}
	if err := r.writeSnapshotDir(ctx, t.Snapshot, base.Snapshot, m, p.VMM, mem); err != nil {
		return nil, err
	}
	if err := atomicfile.SyncTree(t.Dir); err != nil {
		return nil, err
	}
	return t, nil
}
