package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/agentenv/agentenv/internal/atomicfile"
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
// the record and the queue only delays the commit. A node that shares the
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

// commitTemplate queues the upload of a ready built template (daemon-mode
// disks only). A failure to queue is logged: the template serves here.
func (o *Orchestrator) commitTemplate(ctx context.Context, t *template.Template) {
	if o.cfg.Repository == nil || t.RootfsImage == "" || t.ID == template.DefaultID || t.Origin != "" ||
		!t.Ready() || t.BuildID == "" || t.Snapshot == "" {
		return
	}
	if err := fpTemplateReady.Inject(); err != nil {
		o.log.Warn("queue template commit", "template", t.ID, "err", err)
		return
	}
	j, err := uploadJob(ManifestOfTemplate(t.ID, t.BuildID), t.Parent, t.Snapshot, t.RootfsImage)
	j.Kind = repo.KindTemplate
	if err == nil {
		j.Config, err = writePortableTemplate(t, j.Config)
	}
	o.queue(ctx, j, err)
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

// importTemplate brings the template idOrName (its id, or one of its
// names), committed by another node, here. ErrNotFound when the repository
// has none; the caller holds no lock.
func (o *Orchestrator) importTemplate(ctx context.Context, idOrName string) error {
	b, err := o.builder()
	if o.cfg.Remote == nil || err != nil || idOrName == template.DefaultID || repo.ValidName(idOrName) != nil {
		return fmt.Errorf("template %q: %w", idOrName, ErrNotFound)
	}
	o.importMu.Lock()
	defer o.importMu.Unlock()
	return o.importTemplateLocked(ctx, b, idOrName)
}

// templateOf returns the template id a brought sandbox or snapshot was
// created from, bringing it too when this node lacks it (importMu held).
func (o *Orchestrator) templateOf(ctx context.Context, id string) (*template.Template, error) {
	t, err := o.Template(id)
	if !errors.Is(err, ErrNotFound) {
		return t, err
	}
	if b, berr := o.builder(); berr == nil && id != template.DefaultID {
		if ierr := o.importTemplateLocked(ctx, b, id); ierr != nil && !errors.Is(ierr, ErrNotFound) {
			return nil, ierr
		}
	}
	return o.Template(id)
}

// importTemplateLocked is importTemplate with importMu held.
func (o *Orchestrator) importTemplateLocked(ctx context.Context, b *template.Builder, idOrName string) error {
	if _, err := o.Template(idOrName); err == nil {
		return nil // brought by a concurrent create
	}
	m, p, err := o.findTemplate(ctx, idOrName)
	if err != nil {
		return err
	}
	// A record here of that id or a name of it, in any state, keeps its
	// files: nothing is fetched (Adopt checks again, under its lock).
	for _, n := range append([]string{p.Template.ID}, p.Template.Names...) {
		if local, ok := b.Resolve(n); ok {
			return fmt.Errorf("bring template %s (%s): %q is template %s's here: %w", idOrName, m.Name, n, local.ID, ErrConflict)
		}
	}
	t, err := o.rebuildTemplate(ctx, b, m, p)
	if err == nil {
		err = fpTemplateFetched.Inject()
	}
	if err == nil {
		err = b.Adopt(t)
	}
	if err != nil {
		_ = os.RemoveAll(filepath.Join(o.cfg.DataDir, "templates", p.Template.ID))
		return fmt.Errorf("bring template %s from the repository (%s): %w", idOrName, m.Name, err)
	}
	o.log.Info("template brought from the repository", "template", t.ID, "manifest", m.Name)
	return nil
}

// findTemplate returns the newest build's manifest of the template whose id
// is idOrName, else of the one carrying the name, with its portable config.
func (o *Orchestrator) findTemplate(ctx context.Context, idOrName string) (*repo.Manifest, portableTemplate, error) {
	names, err := o.cfg.Remote.Manifests(ctx)
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
		return o.newestTemplate(ctx, idOrName, ms)
	}
	scanned := 0
	for id, ms := range byID {
		if scanned++; scanned > maxTemplateScan {
			break
		}
		m, p, err := o.newestTemplate(ctx, id, ms)
		if err != nil {
			o.log.Warn("template manifest unreadable", "template", id, "err", err)
			continue
		}
		for _, n := range p.Template.Names {
			if n == idOrName {
				return m, p, nil
			}
		}
	}
	return nil, portableTemplate{}, fmt.Errorf("template or snapshot %q: %w", idOrName, ErrNotFound)
}

// newestTemplate reads template id's build manifests ms and returns the
// newest with its portable config.
func (o *Orchestrator) newestTemplate(ctx context.Context, id string, ms []string) (*repo.Manifest, portableTemplate, error) {
	var best *repo.Manifest
	for _, n := range ms {
		m, err := o.cfg.Remote.Manifest(ctx, n)
		if err != nil {
			return nil, portableTemplate{}, fmt.Errorf("template %s: manifest %s: %w", id, n, err)
		}
		if m.Kind == repo.KindTemplate && (best == nil || m.Created.After(best.Created)) {
			best = m
		}
	}
	if best == nil {
		return nil, portableTemplate{}, fmt.Errorf("template %q: %w", id, ErrNotFound)
	}
	raw, err := o.cfg.Remote.ReadSmall(ctx, best.Config, maxPortable)
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
func (o *Orchestrator) rebuildTemplate(ctx context.Context, b *template.Builder, m *repo.Manifest, p portableTemplate) (*template.Template, error) {
	base, err := o.Template(template.DefaultID)
	if err != nil {
		return nil, fmt.Errorf("this node's default template (the boot files): %w", err)
	}
	t := p.Template.Clone()
	// A leftover of a crashed import (the record is stored last).
	if err := os.RemoveAll(filepath.Join(o.cfg.DataDir, "templates", t.ID)); err != nil {
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
	rootfs, err := o.rootfsRefs(ctx, m.Rootfs, t.Dir)
	if err != nil {
		return nil, err
	}
	if err := snapshot.WriteImageConfig(t.RootfsImage, rootfs); err != nil {
		return nil, err
	}
	o.disks.LocalizeLater(t.RootfsImage)
	mem, err := o.fetchAll(ctx, m.Memory, t.Dir)
	if err != nil {
		return nil, err
	}
	if err := o.writeSnapshotDir(ctx, t.Snapshot, base.Snapshot, m.State, p.VMM, mem); err != nil {
		return nil, err
	}
	if err := atomicfile.SyncTree(t.Dir); err != nil {
		return nil, err
	}
	return t, nil
}
