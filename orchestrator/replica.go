package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/agentenv/agentenv/replica"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/store"
	"github.com/agentenv/agentenv/template"
)

// The snapshot repository joins the node as hooks (hooks.go): package
// replica commits pauses, snapshots and templates and brings other nodes'
// here; the orchestrator is its replica.Node (replicaNode).

// AttachReplica joins r to the verbs' hooks and cancels the queued pause
// uploads of sandboxes this node no longer holds. The node's wiring calls
// it once after New (its records are loaded), before EnableBuilds (ready
// templates are committed as the builder loads them) and before the
// uploader starts. The returned cancel detaches it.
func (o *Orchestrator) AttachReplica(r *replica.Replica) (cancel func()) {
	h := Hooks{
		Paused:          func(ctx context.Context, rec sandbox.Record) { r.CommitPause(ctx, replicaSandbox(rec)) },
		SnapshotStored:  r.CommitSnapshot,
		SnapshotDeleted: func(s snapshot.Record) { r.ForgetSnapshot(s.ID) },
		TemplateReady:   r.CommitTemplate,
		Removed:         func(rec sandbox.Record) { r.CancelPauseUploads(rec.ID, rec.Dir) },
		LayerFailure:    r.LayerFailure,
	}
	if r.Imports() {
		h.MissingSource, h.MissingSandbox = r.ImportSource, r.ImportPaused
	}
	cancel = o.Hook(h)
	r.CancelOrphanUploads()
	return cancel
}

// replicaSandbox is a paused sandbox as a commit sees it.
func replicaSandbox(rec sandbox.Record) replica.Sandbox {
	return replica.Sandbox{ID: rec.ID, TemplateID: rec.TemplateID, Dir: rec.Dir, Gen: rec.Gen,
		Snapshot: rec.Snapshot, RootfsImage: rec.RootfsImage, Drives: len(rec.Drives), Record: rec}
}

// ReplicaNode is the orchestrator as package replica sees it.
func (o *Orchestrator) ReplicaNode() replica.Node { return replicaNode{o} }

// replicaNode implements replica.Node.
type replicaNode struct{ o *Orchestrator }

func (n replicaNode) Holds(id string) bool {
	_, err := n.o.lookup(id)
	return err == nil
}

// AdoptPaused records the brought sandbox, paused, at its place here, and
// registers it under refMu like a create's sandbox (deletions see it).
func (n replicaNode) AdoptPaused(p replica.Paused) error {
	var r sandbox.Record
	if err := json.Unmarshal(p.Record, &r); err != nil || r.ID != p.ID {
		return fmt.Errorf("record of sandbox %s: not its own (%v): %w", p.ID, err, ErrInvalid)
	}
	r.Dir, r.State, r.Gen, r.Snapshot, r.RootfsImage = p.Dir, "", p.Gen, p.Snapshot, p.RootfsImage
	r.Memory = snapshot.MemoryImage{}
	r.PID, r.PIDStart, r.Slot, r.Device, r.HasDevice = 0, 0, 0, 0, false
	o := n.o
	o.refMu.Lock()
	defer o.refMu.Unlock()
	// Recorded quietly: the sandbox paused elsewhere; here it only arrives.
	return o.journal.Quietly(r, sandbox.Paused, func(r sandbox.Record) {
		o.mu.Lock()
		o.sandboxes[r.ID] = &instance{rec: r}
		o.mu.Unlock()
	}, nil)
}

func (n replicaNode) Snapshot(idOrName string) (snapshot.Record, error) {
	return n.o.Snapshot(idOrName)
}

func (n replicaNode) PutSnapshot(r snapshot.Record) error {
	return n.o.store.Put(store.Snapshots, r.ID, r)
}

func (n replicaNode) Template(idOrName string) (*template.Template, error) {
	return n.o.Template(idOrName)
}

func (n replicaNode) Builder() (*template.Builder, error) { return n.o.catalog.Builder() }

func (n replicaNode) FetchLater(imageConfig string) { n.o.disks.LocalizeLater(imageConfig) }
