package replica

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/storage/blob"
	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/vmm/memsnap"
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
// Both run before the node resolves the id (its hooks), outside its locks.

// maxPortable bounds a manifest's config blob and VMM state read here; they
// come from the repository, untrusted.
const (
	maxPortable = 1 << 20
	maxState    = 256 << 20
)

var fpImportFetched = failpoint.New("orchestrator/import/fetched") // layers and state here, record not yet

// ImportPaused (the node's hook before a connect resolves a sandbox it
// does not hold) brings sandbox id here from the repository; ErrNotFound
// when it has no pause of it.
func (r *Replica) ImportPaused(ctx context.Context, id string) error {
	if r.cfg.Remote == nil || !validID(id) {
		return fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	r.importMu.Lock()
	defer r.importMu.Unlock()
	if r.node.Holds(id) {
		return nil // brought by a concurrent connect
	}
	start := time.Now()
	m, err := r.newestPause(ctx, id)
	if err != nil {
		return err
	}
	found := time.Since(start)
	p, lazy, err := r.rebuild(ctx, id, m)
	if err != nil {
		return fmt.Errorf("bring sandbox %s from the repository (%s): %w", id, m.Name, err)
	}
	if err := fpImportFetched.Inject(); err != nil {
		return err
	}
	if err := r.node.AdoptPaused(p); err != nil {
		return err
	}
	r.log.Info("sandbox brought from the repository", "sandbox", id, "manifest", m.Name, "lazyRootfs", lazy > 0,
		"found_in", found.Round(time.Millisecond), "took", time.Since(start).Round(time.Millisecond))
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
func (r *Replica) newestPause(ctx context.Context, id string) (*repo.Manifest, error) {
	names, err := r.cfg.Remote.Manifests(ctx)
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
		return nil, fmt.Errorf("sandbox %q: %w", id, errdefs.ErrNotFound)
	}
	return r.cfg.Remote.Manifest(ctx, best)
}

// committed is what a paused sandbox's portable record says of itself.
type committed struct {
	ID         string            `json:"id"`
	TemplateID string            `json:"templateID"`
	Gen        int               `json:"gen"`
	Drives     []json.RawMessage `json:"drives"`
}

// rebuild fetches the manifest's files into the sandbox's directory here
// and returns the sandbox to record, paused, pointing at them, and how
// many of its rootfs layers are read lazily.
func (r *Replica) rebuild(ctx context.Context, id string, m *repo.Manifest) (Paused, int, error) {
	b, err := r.cfg.Remote.ReadSmall(ctx, m.Config, maxPortable)
	if err != nil {
		return Paused{}, 0, err
	}
	var p portable
	var c committed
	if err := json.Unmarshal(b, &p); err == nil {
		err = json.Unmarshal(p.Record, &c)
	}
	if err != nil || c.ID != id || len(p.VMM) == 0 {
		return Paused{}, 0, fmt.Errorf("config blob %s is not this sandbox's (%v)", m.Config.Digest, err)
	}
	if len(c.Drives) > 0 {
		return Paused{}, 0, fmt.Errorf("it has extra drives, which the repository does not carry: %w", errdefs.ErrInvalid)
	}
	t, err := r.templateOf(ctx, c.TemplateID) // templates.go
	if err != nil {
		return Paused{}, 0, fmt.Errorf("its template %s: %w", c.TemplateID, err)
	}
	dir := filepath.Join(r.cfg.DataDir, "sandboxes", id)
	layers := filepath.Join(dir, "layers")
	if err := os.MkdirAll(layers, 0o700); err != nil {
		return Paused{}, 0, err
	}
	rootfs, err := r.lazyRefs(ctx, m.Rootfs, layers, repo.UseRootfs)
	if err != nil {
		return Paused{}, 0, err
	}
	mem, err := r.memoryRefs(ctx, m.Memory, layers)
	if err != nil {
		return Paused{}, 0, err
	}
	out := Paused{ID: id, Record: p.Record, Dir: dir, Gen: c.Gen + 1}
	out.Snapshot = filepath.Join(dir, fmt.Sprintf("snapshot-%d", out.Gen))
	out.RootfsImage = filepath.Join(dir, fmt.Sprintf("rootfs-%d.json", out.Gen))
	if err := snapshot.WriteImageConfig(out.RootfsImage, rootfs); err != nil {
		return Paused{}, 0, err
	}
	if err := r.writeSnapshotDir(ctx, out.Snapshot, t.Snapshot, m, p.VMM, mem); err != nil {
		return Paused{}, 0, err
	}
	r.node.FetchLater(out.RootfsImage)
	return out, lazyCount(rootfs) + lazyCount(mem), nil
}

// lazyRefs names a manifest's layers, read for use, for an image config:
// each by the URL of the node's layer socket, read lazily by the storage
// daemon and fetched whole once the VM answered (disk/lazy.go); on a node
// that serves no layer socket, fetched whole into dir now.
func (r *Replica) lazyRefs(ctx context.Context, ls []repo.Layer, dir, use string) ([]string, error) {
	out := make([]string, 0, len(ls))
	for _, l := range ls {
		if u := r.cfg.Remote.LazyURL(l, use); u != "" {
			out = append(out, u)
			continue
		}
		p, err := r.cfg.Remote.Fetch(ctx, l, dir)
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

// memoryRefs names a manifest's memory layers: lazily (lazyRefs) where the
// node's VMs map memory from the storage daemon's exports, else fetched
// whole into dir.
func (r *Replica) memoryRefs(ctx context.Context, ls []repo.Layer, dir string) ([]string, error) {
	if r.cfg.LazyMemory {
		return r.lazyRefs(ctx, ls, dir, repo.UseMemory)
	}
	return r.fetchAll(ctx, ls, dir)
}

// fetchAll keeps the layers local in dir, bottom first.
func (r *Replica) fetchAll(ctx context.Context, ls []repo.Layer, dir string) ([]string, error) {
	out := make([]string, 0, len(ls))
	for _, l := range ls {
		p, err := r.cfg.Remote.Fetch(ctx, l, dir)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// writeSnapshotDir makes a VMM snapshot directory here: the state of
// manifest m, the VMM config relocated to this node's boot files (those of
// the local template snapshot reference), the memory manifest of the
// layers mem and, for a stack read lazily, its working set.
func (r *Replica) writeSnapshotDir(ctx context.Context, dir, reference string, m *repo.Manifest, vmmConfig []byte, mem []string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	st, err := r.cfg.Remote.ReadSmall(ctx, m.State, maxState)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, vmm.SnapshotStateFile), st, 0o600); err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, vmm.SnapshotConfigFile), vmmConfig, 0o600); err != nil {
		return err
	}
	rl, ok := r.cfg.Driver.(vmm.Relocator)
	if !ok {
		return errors.New("this node's VMM cannot restore a snapshot taken on another host")
	}
	if err := rl.RelocateSnapshot(dir, reference); err != nil {
		return err
	}
	if len(mem) == 0 {
		return errors.New("the pause carries no memory layers")
	}
	if lazyCount(mem) > 0 {
		r.putPack(ctx, m, dir)
	}
	return snapshot.WriteMemoryManifest(dir, snapshot.MemoryImage{Layers: mem, File: filepath.Join(dir, snapshot.FlatMemory)})
}

// putPack writes the working-set pack m commits, if any, into the
// snapshot directory dir (snapshot.WorkingSetPackFile), read whole and
// checked against its digest and format. A failure is logged: the
// restore then reads the pages from the layers.
func (r *Replica) putPack(ctx context.Context, m *repo.Manifest, dir string) {
	if m.WorkingSet == nil {
		return
	}
	start := time.Now()
	data, err := r.cfg.Remote.ReadPack(ctx, *m.WorkingSet)
	var pack memsnap.Pack
	if err == nil {
		pack, err = memsnap.ReadPack(bytes.NewReader(data), int64(len(data)))
	}
	var ws []byte
	if err == nil {
		ws, err = pack.WorkingSet()
	}
	if err == nil { // the working set too: a node without FUSE exports reads it ahead
		err = atomicfile.WriteFile(filepath.Join(dir, snapshot.WorkingSetFile), ws, 0o600)
	}
	if err == nil {
		err = atomicfile.WriteFile(filepath.Join(dir, snapshot.WorkingSetPackFile), data, 0o600)
	}
	if err != nil {
		r.log.Warn("memory working-set pack of a brought snapshot not kept (its restore reads the pages from the layers)", "manifest", m.Name, "err", err)
		return
	}
	r.log.Info("memory working-set pack kept", "manifest", m.Name, "bytes", len(data), "took", time.Since(start).Round(time.Millisecond))
}

// ImportSnapshot (the node's hook before a create resolves a source it
// does not know) brings snapshot id, committed to the repository by
// another node, here: its layers fetched into data_dir/snapshots/<id>, its
// VMM snapshot directory rebuilt (relocated to this node's boot files) and
// its record stored last. Then sandboxes are created and forked from it as
// from any local snapshot. ErrNotFound when the repository has none.
func (r *Replica) ImportSnapshot(ctx context.Context, id string) error {
	if r.cfg.Remote == nil || !validID(id) {
		return fmt.Errorf("snapshot %q: %w", id, errdefs.ErrNotFound)
	}
	r.importMu.Lock()
	defer r.importMu.Unlock()
	if _, err := r.node.Snapshot(id); err == nil {
		return nil // brought by a concurrent create
	}
	m, err := r.cfg.Remote.Manifest(ctx, ManifestOfSnapshot(id))
	if errors.Is(err, repo.ErrNotFound) {
		return fmt.Errorf("template or snapshot %q: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("snapshot %s: read the repository: %w", id, err)
	}
	b, err := r.cfg.Remote.ReadSmall(ctx, m.Config, maxPortable)
	if err != nil {
		return fmt.Errorf("bring snapshot %s: %w", id, err)
	}
	var p portableSnapshot
	if err := json.Unmarshal(b, &p); err != nil || p.Snapshot.ID != id || len(p.VMM) == 0 {
		return fmt.Errorf("bring snapshot %s: config blob %s is not this snapshot's (%v)", id, m.Config.Digest, err)
	}
	if len(p.Snapshot.Drives) > 0 {
		return fmt.Errorf("bring snapshot %s: it has extra drives, which the repository does not carry: %w", id, errdefs.ErrInvalid)
	}
	t, err := r.templateOf(ctx, p.Snapshot.TemplateID)
	if err != nil {
		return fmt.Errorf("bring snapshot %s: its template %s: %w", id, p.Snapshot.TemplateID, err)
	}
	s := p.Snapshot
	s.Dir = filepath.Join(r.cfg.DataDir, "snapshots", id)
	s.VM, s.RootfsImage, s.Rootfs = filepath.Join(s.Dir, "vm"), filepath.Join(s.Dir, "rootfs.json"), ""
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return err
	}
	rootfs, err := r.lazyRefs(ctx, m.Rootfs, s.Dir, repo.UseRootfs)
	if err == nil {
		err = snapshot.WriteImageConfig(s.RootfsImage, rootfs)
	}
	var mem []string
	if err == nil {
		mem, err = r.memoryRefs(ctx, m.Memory, s.Dir)
	}
	if err == nil {
		err = r.writeSnapshotDir(ctx, s.VM, t.Snapshot, m, p.VMM, mem)
	}
	if err == nil {
		err = fpImportFetched.Inject()
	}
	if err == nil {
		err = r.node.PutSnapshot(s)
	}
	if err != nil {
		_ = os.RemoveAll(s.Dir)
		return fmt.Errorf("bring snapshot %s from the repository: %w", id, err)
	}
	r.node.FetchLater(s.RootfsImage)
	r.log.Info("snapshot brought from the repository", "snapshot", id, "lazyLayers", lazyCount(rootfs)+lazyCount(mem))
	return nil
}

// ImportSource (the node's hook before a create resolves a template or
// snapshot id it does not know) brings a snapshot of that id, else a
// template of that id or name, here; ErrNotFound when the repository has
// neither.
func (r *Replica) ImportSource(ctx context.Context, id string) error {
	err := r.ImportSnapshot(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		err = r.ImportTemplate(ctx, id)
	}
	return err
}
