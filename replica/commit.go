package replica

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

// Commits: a pause and a snapshot stay synchronous and durable on the
// node, and then (their hooks) queue a commit of what they wrote (sealed
// layers, VM state and config) to the repository, uploaded in the
// background. The queue is durable, so a crash or a store that is down
// only delays an upload.

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
	j := upload.Job{Name: name, Kind: repo.KindSnapshot, Parent: parent, Created: time.Now().UTC(),
		Rootfs: layers, Memory: mem.Layers,
		State: filepath.Join(vmDir, vmm.SnapshotStateFile), Config: filepath.Join(vmDir, vmm.SnapshotConfigFile)}
	ws := filepath.Join(vmDir, snapshot.WorkingSetFile)
	if _, err := os.Stat(ws); err == nil { // a hint: a capture may have recorded none
		j.WorkingSet = ws
	}
	return j, nil
}

// CommitPause (the node's hook after a pause with memory is durable and
// its VMM gone) queues the upload of a paused sandbox's state (layered
// disks only: a file-mode disk is no layer stack). The job reads hard
// links of the files in <dir>/upload-<gen>, so a merge of the sandbox's
// layers or its next pause cannot pull them away mid-upload; the links of
// earlier pauses whose upload ended go now. A failure to queue is logged:
// the pause itself is durable here.
func (r *Replica) CommitPause(ctx context.Context, rec Sandbox) {
	if r.cfg.Uploads == nil || rec.RootfsImage == "" {
		return
	}
	if rec.Drives > 0 {
		r.log.Info("not uploading a paused sandbox with extra drives (the repository carries root disks only)", "sandbox", rec.ID)
		return
	}
	name := ManifestOfPause(rec.ID, rec.Gen)
	r.dropFinishedStaging(rec)
	dir := filepath.Join(rec.Dir, fmt.Sprintf("upload-%d", rec.Gen))
	j, err := uploadJob(name, rec.TemplateID, rec.Snapshot, rec.RootfsImage)
	if err == nil {
		err = stage(&j, dir)
	}
	if err == nil {
		j.Config, err = writePortable(dir, rec, j.Config)
	}
	r.queue(ctx, j, err)
}

// portable is the config blob of a paused sandbox's manifest: its record
// (what another node needs to resume it: resources, tokens, metadata,
// timeouts) and the VMM's snapshot config.
type portable struct {
	Record json.RawMessage `json:"record"`
	VMM    json.RawMessage `json:"vmm"`
}

// writePortable writes the portable config of rec next to the staged
// files, from the VMM config at vmmConfig, and returns its path.
func writePortable(dir string, rec Sandbox, vmmConfig string) (string, error) {
	raw, err := os.ReadFile(vmmConfig)
	if err != nil {
		return "", fmt.Errorf("portable config of %s: %w", rec.ID, err)
	}
	record, err := json.Marshal(rec.Record)
	if err != nil {
		return "", fmt.Errorf("portable config of %s: %w", rec.ID, err)
	}
	b, err := json.Marshal(portable{Record: record, VMM: raw})
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
	if j.WorkingSet != "" {
		if err := link(&j.WorkingSet); err != nil {
			return err
		}
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
func (r *Replica) dropFinishedStaging(rec Sandbox) {
	for gen, d := range stagedPauses(rec.Dir) {
		if gen == rec.Gen {
			continue
		}
		name := ManifestOfPause(rec.ID, gen)
		st, ok := r.cfg.Uploads.Status(name)
		if ok && (st.State == upload.Pending || st.State == upload.Uploading) {
			continue
		}
		if ok {
			_ = r.cfg.Uploads.Forget(name)
		}
		_ = os.RemoveAll(d)
	}
}

// CancelPauseUploads (the node's hook after a sandbox left its registry,
// before its directory goes) drops the queued uploads of the sandbox's
// pauses (their staged files go with the directory dir): a killed
// sandbox, or a stale copy whose sandbox another node took over and pauses
// under the same names.
func (r *Replica) CancelPauseUploads(id, dir string) {
	if r.cfg.Uploads == nil {
		return
	}
	for gen := range stagedPauses(dir) {
		if err := r.cfg.Uploads.Cancel(ManifestOfPause(id, gen)); err != nil {
			r.log.Warn("cancel the upload of a pause", "sandbox", id, "gen", gen, "err", err)
		}
	}
}

// CancelOrphanUploads drops the queued pause uploads of sandboxes the node
// no longer holds (a kill or a stale copy's removal that a crash cut before
// its uploads were cancelled): their staged files went with the sandbox's
// directory, so they could only fail. The node runs it once its records
// are loaded, before the uploader starts.
func (r *Replica) CancelOrphanUploads() {
	if r.cfg.Uploads == nil {
		return
	}
	for _, st := range r.cfg.Uploads.Queued() {
		id, ok := PauseOf(st.Name)
		if !ok || r.node.Holds(id) {
			continue
		}
		if err := r.cfg.Uploads.Cancel(st.Name); err != nil {
			r.log.Warn("cancel the upload of a gone sandbox's pause", "job", st.Name, "err", err)
			continue
		}
		r.log.Info("cancelled the upload of a gone sandbox's pause", "job", st.Name)
	}
}

// PauseOf is the sandbox a ManifestOfPause name belongs to (the cluster's
// commit fence reads it).
func PauseOf(name string) (id string, ok bool) {
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

// CommitSnapshot (the node's hook after a snapshot's record is stored)
// queues the upload of a snapshot (its files are immutable in its own
// directory; its portable config, the snapshot's record and the VMM
// config, is written next to them).
func (r *Replica) CommitSnapshot(ctx context.Context, s snapshot.Record) {
	if r.cfg.Uploads == nil || s.RootfsImage == "" || s.Hidden {
		return
	}
	if len(s.Drives) > 0 {
		r.log.Info("not uploading a snapshot with extra drives (the repository carries root disks only)", "snapshot", s.ID)
		return
	}
	j, err := uploadJob(ManifestOfSnapshot(s.ID), s.TemplateID, s.VM, s.RootfsImage)
	if err == nil {
		j.Config, err = writePortableSnapshot(s, j.Config)
	}
	r.queue(ctx, j, err)
}

// ForgetSnapshot (the node's hook after a snapshot was deleted) drops its
// record in the upload queue (one still uploading fails on its own: the
// files are gone); what the repository holds stays.
func (r *Replica) ForgetSnapshot(id string) {
	if r.cfg.Uploads != nil {
		_ = r.cfg.Uploads.Forget(ManifestOfSnapshot(id))
	}
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
func (r *Replica) queue(ctx context.Context, j upload.Job, err error) {
	if repo.ValidName(j.Parent) != nil {
		j.Parent = ""
	}
	if err == nil {
		err = r.cfg.Uploads.Commit(context.WithoutCancel(ctx), j)
	}
	if err != nil {
		r.log.Warn("queue repository commit (this node keeps it)", "manifest", j.Name, "err", err)
		return
	}
	r.log.Info("repository commit queued", "manifest", j.Name, "layers", len(j.Rootfs)+len(j.Memory))
}

// SnapshotStatus reports where the upload of snapshot id's commit is
// (false when the node has no repository or never queued it).
func (r *Replica) SnapshotStatus(id string) (upload.Status, bool) {
	if r == nil || r.cfg.Uploads == nil {
		return upload.Status{}, false
	}
	return r.cfg.Uploads.Status(ManifestOfSnapshot(id))
}
