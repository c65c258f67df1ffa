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
	"time"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/snapshot/repo/upload"
	"github.com/agentenv/agentenv/vmm"
)

// The snapshot repository (package snapshot/repo), when the node has one:
// a pause and a snapshot stay synchronous and durable on this node, and
// then queue a commit of what they wrote (sealed layers, VM state and
// config) to the repository, uploaded in the background. The queue is
// durable, so a crash or a store that is down only delays an upload.

// Uploads is the repository as the orchestrator uses it (reponode.Node).
type Uploads interface {
	Commit(ctx context.Context, j upload.Job) error
	Status(name string) (upload.Status, bool)
	Forget(name string) error
	// Cancel drops a queued job, stopping an attempt in flight.
	Cancel(name string) error
	// Queued lists the jobs in the queue.
	Queued() []upload.Status
}

// ManifestOfPause names the repository manifest of the pause that made the
// sandbox's generation gen paused.
func ManifestOfPause(id string, gen int) string { return fmt.Sprintf("sandbox-%s-%d", id, gen) }

// ManifestOfSnapshot names the repository manifest of a snapshot.
func ManifestOfSnapshot(id string) string { return "snapshot-" + id }

// uploadJob describes the files of a VMM snapshot directory vmDir and the
// disk image config rootfs as a repository commit.
func uploadJob(name, parent, vmDir, rootfs string) (upload.Job, error) {
	layers, err := snapshot.LayersOf(rootfs)
	if err != nil {
		return upload.Job{}, fmt.Errorf("rootfs of %s: %w", name, err)
	}
	mem, err := snapshot.ReadMemoryManifest(vmDir)
	if errors.Is(err, os.ErrNotExist) {
		// The VMM's snapshot carries the memory whole: it is a layer of
		// its own, as far as the repository is concerned.
		mem, err = snapshot.MemoryImage{Layers: []string{filepath.Join(vmDir, vmm.SnapshotMemoryFile)}}, nil
	}
	if err != nil {
		return upload.Job{}, fmt.Errorf("memory of %s: %w", name, err)
	}
	return upload.Job{Name: name, Kind: repo.KindSnapshot, Parent: parent, Created: time.Now().UTC(),
		Rootfs: layers, Memory: mem.Layers,
		State: filepath.Join(vmDir, vmm.SnapshotStateFile), Config: filepath.Join(vmDir, vmm.SnapshotConfigFile)}, nil
}

// commitPause queues the upload of a paused sandbox's state (daemon-mode
// disks only: a file-mode disk is no layer stack). The job reads hard
// links of the files in <dir>/upload-<gen>, so a merge of the sandbox's
// layers (compact.go) or its next pause cannot pull them away mid-upload;
// the links of earlier pauses whose upload ended go now. A failure to
// queue is logged: the pause itself is durable here.
func (o *Orchestrator) commitPause(ctx context.Context, rec Record) {
	if o.cfg.Repository == nil || rec.RootfsImage == "" {
		return
	}
	if len(rec.Drives) > 0 {
		o.log.Info("not uploading a paused sandbox with extra drives (the repository carries root disks only)", "sandbox", rec.ID)
		return
	}
	name := ManifestOfPause(rec.ID, rec.Gen)
	o.dropFinishedStaging(rec)
	dir := filepath.Join(rec.Dir, fmt.Sprintf("upload-%d", rec.Gen))
	j, err := uploadJob(name, rec.TemplateID, rec.Snapshot, rec.RootfsImage)
	if err == nil {
		err = stage(&j, dir)
	}
	if err == nil {
		j.Config, err = writePortable(dir, rec, j.Config)
	}
	o.queue(ctx, j, err)
}

// portable is the config blob of a paused sandbox's manifest: its record
// (what another node needs to resume it: resources, tokens, metadata,
// timeouts) and the VMM's snapshot config.
type portable struct {
	Record Record          `json:"record"`
	VMM    json.RawMessage `json:"vmm"`
}

// writePortable writes the portable config of rec next to the staged
// files, from the VMM config at vmmConfig, and returns its path.
func writePortable(dir string, rec Record, vmmConfig string) (string, error) {
	raw, err := os.ReadFile(vmmConfig)
	if err != nil {
		return "", fmt.Errorf("portable config of %s: %w", rec.ID, err)
	}
	b, err := json.Marshal(portable{Record: rec, VMM: raw})
	if err != nil {
		return "", fmt.Errorf("portable config of %s: %w", rec.ID, err)
	}
	path := filepath.Join(dir, "sandbox.json")
	if err := atomicfile.WriteFile(path, b, 0o600); err != nil {
		return "", fmt.Errorf("portable config of %s: %w", rec.ID, err)
	}
	return path, nil
}

// stage replaces the job's files by hard links in dir.
func stage(j *upload.Job, dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("stage %s: %w", j.Name, err)
	}
	n := 0
	link := func(p *string) error {
		n++
		dst := filepath.Join(dir, fmt.Sprintf("%03d-%s", n, filepath.Base(*p)))
		if err := snapshot.LinkOrCopy(*p, dst); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("stage %s: %w", j.Name, err)
		}
		*p = dst
		return nil
	}
	for _, list := range [][]string{j.Rootfs, j.Memory} {
		for i := range list {
			if err := link(&list[i]); err != nil {
				return err
			}
		}
	}
	if err := link(&j.State); err != nil {
		return err
	}
	return link(&j.Config)
}

// stagedPauses lists the staged upload directories in a sandbox's directory
// (<dir>/upload-<gen>), by generation.
func stagedPauses(dir string) map[int]string {
	out := map[int]string{}
	dirs, _ := filepath.Glob(filepath.Join(dir, "upload-*"))
	for _, d := range dirs {
		var gen int
		if _, err := fmt.Sscanf(filepath.Base(d), "upload-%d", &gen); err == nil {
			out[gen] = d
		}
	}
	return out
}

// dropFinishedStaging removes the staged links of the sandbox's earlier
// pauses whose upload is over (uploaded, failed, or unknown to the queue),
// and their records in the queue (the repository keeps what was uploaded).
func (o *Orchestrator) dropFinishedStaging(rec Record) {
	for gen, d := range stagedPauses(rec.Dir) {
		if gen == rec.Gen {
			continue
		}
		name := ManifestOfPause(rec.ID, gen)
		st, ok := o.cfg.Repository.Status(name)
		if ok && (st.State == upload.Pending || st.State == upload.Uploading) {
			continue
		}
		if ok {
			_ = o.cfg.Repository.Forget(name)
		}
		_ = os.RemoveAll(d)
	}
}

// cancelPauseUploads drops the queued uploads of the sandbox's pauses (its
// staged files go with its directory): a killed sandbox, or a stale copy
// whose sandbox another node took over and pauses under the same names.
func (o *Orchestrator) cancelPauseUploads(rec Record) {
	if o.cfg.Repository == nil {
		return
	}
	for gen := range stagedPauses(rec.Dir) {
		if err := o.cfg.Repository.Cancel(ManifestOfPause(rec.ID, gen)); err != nil {
			o.log.Warn("cancel the upload of a pause", "sandbox", rec.ID, "gen", gen, "err", err)
		}
	}
}

// cancelOrphanUploads drops the queued pause uploads of sandboxes this node
// no longer holds (a kill or a stale copy's removal that a crash cut before
// its uploads were cancelled): their staged files went with the sandbox's
// directory, so they could only fail.
func (o *Orchestrator) cancelOrphanUploads() {
	if o.cfg.Repository == nil {
		return
	}
	for _, st := range o.cfg.Repository.Queued() {
		id, ok := pauseOf(st.Name)
		if !ok {
			continue
		}
		o.mu.Lock()
		_, held := o.sandboxes[id]
		o.mu.Unlock()
		if held {
			continue
		}
		if err := o.cfg.Repository.Cancel(st.Name); err != nil {
			o.log.Warn("cancel the upload of a gone sandbox's pause", "job", st.Name, "err", err)
			continue
		}
		o.log.Info("cancelled the upload of a gone sandbox's pause", "job", st.Name)
	}
}

// pauseOf is the sandbox a ManifestOfPause name belongs to.
func pauseOf(name string) (id string, ok bool) {
	rest, ok := strings.CutPrefix(name, "sandbox-")
	i := strings.LastIndexByte(rest, '-')
	if !ok || i <= 0 {
		return "", false
	}
	if _, err := strconv.Atoi(rest[i+1:]); err != nil {
		return "", false
	}
	return rest[:i], true
}

// commitSnapshot queues the upload of a snapshot (its files are immutable
// in its own directory; its portable config, the snapshot's record and
// the VMM config, is written next to them).
func (o *Orchestrator) commitSnapshot(ctx context.Context, r snapshot.Record) {
	if o.cfg.Repository == nil || r.RootfsImage == "" || r.Hidden {
		return
	}
	if len(r.Drives) > 0 {
		o.log.Info("not uploading a snapshot with extra drives (the repository carries root disks only)", "snapshot", r.ID)
		return
	}
	j, err := uploadJob(ManifestOfSnapshot(r.ID), r.TemplateID, r.VM, r.RootfsImage)
	if err == nil {
		j.Config, err = writePortableSnapshot(r, j.Config)
	}
	o.queue(ctx, j, err)
}

// portableSnapshot is the config blob of a snapshot's manifest.
type portableSnapshot struct {
	Snapshot snapshot.Record `json:"snapshot"`
	VMM      json.RawMessage `json:"vmm"`
}

func writePortableSnapshot(r snapshot.Record, vmmConfig string) (string, error) {
	raw, err := os.ReadFile(vmmConfig)
	if err != nil {
		return "", fmt.Errorf("portable config of snapshot %s: %w", r.ID, err)
	}
	b, err := json.Marshal(portableSnapshot{Snapshot: r, VMM: raw})
	if err != nil {
		return "", fmt.Errorf("portable config of snapshot %s: %w", r.ID, err)
	}
	path := filepath.Join(r.Dir, "snapshot.json")
	if err := atomicfile.WriteFile(path, b, 0o600); err != nil {
		return "", fmt.Errorf("portable config of snapshot %s: %w", r.ID, err)
	}
	return path, nil
}

// queue hands a job to the repository, unless preparing it failed (err).
func (o *Orchestrator) queue(ctx context.Context, j upload.Job, err error) {
	if repo.ValidName(j.Parent) != nil {
		j.Parent = ""
	}
	if err == nil {
		err = o.cfg.Repository.Commit(context.WithoutCancel(ctx), j)
	}
	if err != nil {
		o.log.Warn("queue repository commit (this node keeps it)", "manifest", j.Name, "err", err)
		return
	}
	o.log.Info("repository commit queued", "manifest", j.Name, "layers", len(j.Rootfs)+len(j.Memory))
}

// RepositoryStatus reports where a manifest's upload is ("" state when the
// node has no repository or never queued it).
func (o *Orchestrator) RepositoryStatus(name string) (upload.Status, bool) {
	if o.cfg.Repository == nil {
		return upload.Status{}, false
	}
	return o.cfg.Repository.Status(name)
}
