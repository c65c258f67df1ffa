package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/storage/blob"
	"github.com/agentenv/agentenv/store"
	"github.com/agentenv/agentenv/vmm"
)

// A sandbox paused on another node that shares this node's repository is
// brought here when a client connects to it (Connect of an id this node does
// not know): the newest manifest of its pauses names its layers, VMM state
// and portable config; the layers are fetched (verified, peers first), the
// snapshot directory is rebuilt here, pointed at this node's copy of its
// template's boot files, and the sandbox is recorded paused, last. Then it
// resumes like any paused sandbox. The node it came from keeps its own
// record (a cluster's bindings say which node serves it). A snapshot
// committed elsewhere is brought the same way by a create that names it.

// Remote is the repository's read side as the orchestrator uses it
// (reponode.Node).
type Remote interface {
	Manifests(ctx context.Context) ([]string, error)
	Manifest(ctx context.Context, name string) (*repo.Manifest, error)
	Fetch(ctx context.Context, l repo.Layer, dir string) (string, error)
	ReadSmall(ctx context.Context, b repo.Blob, limit int64) ([]byte, error)
	// LazyURL names l for the storage daemon to read lazily through the
	// node's layer socket ("" when the node serves none: fetch it whole).
	LazyURL(l repo.Layer) string
	// LazyLayer is the layer a LazyURL names.
	LazyLayer(url string) (repo.Layer, bool)
}

// maxPortable bounds a manifest's config blob and VMM state read here; they
// come from the repository, untrusted.
const (
	maxPortable = 1 << 20
	maxState    = 256 << 20
)

var fpImportFetched = failpoint.New("orchestrator/import/fetched") // layers and state here, record not yet

// importPaused brings sandbox id here from the repository; ErrNotFound when
// it has no pause of it.
func (o *Orchestrator) importPaused(ctx context.Context, id string) error {
	if o.cfg.Remote == nil || !validID(id) {
		return fmt.Errorf("sandbox %q: %w", id, ErrNotFound)
	}
	o.importMu.Lock()
	defer o.importMu.Unlock()
	if _, err := o.lookup(id); err == nil {
		return nil // brought by a concurrent connect
	}
	m, err := o.newestPause(ctx, id)
	if err != nil {
		return err
	}
	rec, err := o.rebuild(ctx, id, m)
	if err != nil {
		return fmt.Errorf("bring sandbox %s from the repository (%s): %w", id, m.Name, err)
	}
	if err := fpImportFetched.Inject(); err != nil {
		return err
	}
	// refMu: registered like a create's sandbox (deletions see it).
	o.refMu.Lock()
	defer o.refMu.Unlock()
	if err := o.store.Put(store.Sandboxes, rec.ID, rec); err != nil {
		return fmt.Errorf("record sandbox %s: %w", id, err)
	}
	o.mu.Lock()
	o.sandboxes[rec.ID] = &instance{rec: rec}
	o.mu.Unlock()
	o.log.Info("sandbox brought from the repository", "sandbox", id, "manifest", m.Name, "lazyRootfs", o.disks.IsRemote(rec.RootfsImage))
	return nil
}

// validID: an id that can name files and manifests ([a-z0-9], as ours).
func validID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// newestPause finds the manifest of the sandbox's latest pause.
func (o *Orchestrator) newestPause(ctx context.Context, id string) (*repo.Manifest, error) {
	names, err := o.cfg.Remote.Manifests(ctx)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s: list the repository: %w", id, err)
	}
	prefix, best, bestGen := "sandbox-"+id+"-", "", -1
	for _, n := range names {
		if g, err := strconv.Atoi(strings.TrimPrefix(n, prefix)); err == nil && strings.HasPrefix(n, prefix) && g > bestGen {
			best, bestGen = n, g
		}
	}
	if best == "" {
		return nil, fmt.Errorf("sandbox %q: %w", id, ErrNotFound)
	}
	return o.cfg.Remote.Manifest(ctx, best)
}

// rebuild fetches the manifest's files into the sandbox's directory here
// and returns its record, paused, pointing at them.
func (o *Orchestrator) rebuild(ctx context.Context, id string, m *repo.Manifest) (Record, error) {
	b, err := o.cfg.Remote.ReadSmall(ctx, m.Config, maxPortable)
	if err != nil {
		return Record{}, err
	}
	var p portable
	if err := json.Unmarshal(b, &p); err != nil || p.Record.ID != id || len(p.VMM) == 0 {
		return Record{}, fmt.Errorf("config blob %s is not this sandbox's (%v)", m.Config.Digest, err)
	}
	if len(p.Record.Drives) > 0 {
		return Record{}, fmt.Errorf("it has extra drives, which the repository does not carry: %w", ErrInvalid)
	}
	t, err := o.templateOf(ctx, p.Record.TemplateID) // templaterepo.go
	if err != nil {
		return Record{}, fmt.Errorf("its template %s: %w", p.Record.TemplateID, err)
	}
	dir := filepath.Join(o.cfg.DataDir, "sandboxes", id)
	layers := filepath.Join(dir, "layers")
	if err := os.MkdirAll(layers, 0o700); err != nil {
		return Record{}, err
	}
	rootfs, err := o.rootfsRefs(ctx, m.Rootfs, layers)
	if err != nil {
		return Record{}, err
	}
	mem, err := o.fetchAll(ctx, m.Memory, layers)
	if err != nil {
		return Record{}, err
	}
	r := p.Record
	r.Dir, r.State, r.Gen = dir, Paused, r.Gen+1
	r.Snapshot = filepath.Join(dir, fmt.Sprintf("snapshot-%d", r.Gen))
	r.RootfsImage = filepath.Join(dir, fmt.Sprintf("rootfs-%d.json", r.Gen))
	r.Memory = snapshot.MemoryImage{}
	r.PID, r.PIDStart, r.Slot, r.Device, r.HasDevice = 0, 0, 0, 0, false
	if err := snapshot.WriteImageConfig(r.RootfsImage, rootfs); err != nil {
		return Record{}, err
	}
	if err := o.writeSnapshotDir(ctx, r.Snapshot, t.Snapshot, m.State, p.VMM, mem); err != nil {
		return Record{}, err
	}
	o.disks.LocalizeLater(r.RootfsImage)
	return r, nil
}

// rootfsRefs names a manifest's rootfs layers for an image config: each by
// the URL of the node's layer socket, read lazily by the storage daemon and
// fetched whole once the VM answered (disk/lazy.go); on a node that serves no
// layer socket, fetched whole into dir now.
func (o *Orchestrator) rootfsRefs(ctx context.Context, ls []repo.Layer, dir string) ([]string, error) {
	out := make([]string, 0, len(ls))
	for _, l := range ls {
		if u := o.cfg.Remote.LazyURL(l); u != "" {
			out = append(out, u)
			continue
		}
		p, err := o.cfg.Remote.Fetch(ctx, l, dir)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// lazyCount counts the refs read lazily (URLs).
func lazyCount(refs []string) int {
	n := 0
	for _, r := range refs {
		if blob.IsURL(r) {
			n++
		}
	}
	return n
}

// fetchAll keeps the layers local in dir, bottom first.
func (o *Orchestrator) fetchAll(ctx context.Context, ls []repo.Layer, dir string) ([]string, error) {
	out := make([]string, 0, len(ls))
	for _, l := range ls {
		p, err := o.cfg.Remote.Fetch(ctx, l, dir)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// writeSnapshotDir makes a VMM snapshot directory here: the state, the VMM
// config relocated to this node's boot files (those of the local template
// snapshot reference), and the memory manifest of the fetched layers.
func (o *Orchestrator) writeSnapshotDir(ctx context.Context, dir, reference string, state repo.Blob, vmmConfig []byte, mem []string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	st, err := o.cfg.Remote.ReadSmall(ctx, state, maxState)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, vmm.SnapshotStateFile), st, 0o600); err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, vmm.SnapshotConfigFile), vmmConfig, 0o600); err != nil {
		return err
	}
	rl, ok := o.drv.(vmm.Relocator)
	if !ok {
		return errors.New("this node's VMM cannot restore a snapshot taken on another host")
	}
	if err := rl.RelocateSnapshot(dir, reference); err != nil {
		return err
	}
	if len(mem) == 0 {
		return errors.New("the pause carries no memory layers")
	}
	return snapshot.WriteMemoryManifest(dir, snapshot.MemoryImage{Layers: mem, File: filepath.Join(dir, snapshot.FlatMemory)})
}

// importSnapshot brings snapshot id, committed to the repository by another
// node, here: its layers fetched into data_dir/snapshots/<id>, its VMM
// snapshot directory rebuilt (relocated to this node's boot files) and its
// record stored last. Then sandboxes are created and forked from it as
// from any local snapshot. ErrNotFound when the repository has none.
func (o *Orchestrator) importSnapshot(ctx context.Context, id string) error {
	if o.cfg.Remote == nil || !validID(id) {
		return fmt.Errorf("snapshot %q: %w", id, ErrNotFound)
	}
	o.importMu.Lock()
	defer o.importMu.Unlock()
	if _, err := o.Snapshot(id); err == nil {
		return nil // brought by a concurrent create
	}
	m, err := o.cfg.Remote.Manifest(ctx, ManifestOfSnapshot(id))
	if errors.Is(err, repo.ErrNotFound) {
		return fmt.Errorf("template or snapshot %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("snapshot %s: read the repository: %w", id, err)
	}
	b, err := o.cfg.Remote.ReadSmall(ctx, m.Config, maxPortable)
	if err != nil {
		return fmt.Errorf("bring snapshot %s: %w", id, err)
	}
	var p portableSnapshot
	if err := json.Unmarshal(b, &p); err != nil || p.Snapshot.ID != id || len(p.VMM) == 0 {
		return fmt.Errorf("bring snapshot %s: config blob %s is not this snapshot's (%v)", id, m.Config.Digest, err)
	}
	if len(p.Snapshot.Drives) > 0 {
		return fmt.Errorf("bring snapshot %s: it has extra drives, which the repository does not carry: %w", id, ErrInvalid)
	}
	t, err := o.templateOf(ctx, p.Snapshot.TemplateID)
	if err != nil {
		return fmt.Errorf("bring snapshot %s: its template %s: %w", id, p.Snapshot.TemplateID, err)
	}
	r := p.Snapshot
	r.Dir = filepath.Join(o.cfg.DataDir, "snapshots", id)
	r.VM, r.RootfsImage, r.Rootfs = filepath.Join(r.Dir, "vm"), filepath.Join(r.Dir, "rootfs.json"), ""
	if err := os.MkdirAll(r.Dir, 0o700); err != nil {
		return err
	}
	rootfs, err := o.rootfsRefs(ctx, m.Rootfs, r.Dir)
	if err == nil {
		err = snapshot.WriteImageConfig(r.RootfsImage, rootfs)
	}
	var mem []string
	if err == nil {
		mem, err = o.fetchAll(ctx, m.Memory, r.Dir)
	}
	if err == nil {
		err = o.writeSnapshotDir(ctx, r.VM, t.Snapshot, m.State, p.VMM, mem)
	}
	if err == nil {
		err = fpImportFetched.Inject()
	}
	if err == nil {
		err = o.store.Put(store.Snapshots, r.ID, r)
	}
	if err != nil {
		_ = os.RemoveAll(r.Dir)
		return fmt.Errorf("bring snapshot %s from the repository: %w", id, err)
	}
	o.disks.LocalizeLater(r.RootfsImage)
	o.log.Info("snapshot brought from the repository", "snapshot", id, "lazyLayers", lazyCount(rootfs))
	return nil
}
