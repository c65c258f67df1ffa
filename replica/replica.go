// Package replica keeps a node's sandboxes, snapshots and templates in the
// snapshot repository (package snapshot/repo) and brings other nodes'
// here. It joins the node's lifecycle as hooks, never called by the verbs:
//
//   - after a pause, a snapshot or a template build is durable here, its
//     files are committed (staged as hard links, queued for a durable
//     background upload: commit.go, templates.go);
//   - after a sandbox is removed (a kill, a failed create, a dropped stale
//     copy), the uploads of its pauses are cancelled;
//   - before a connect resolves a sandbox this node does not hold, or a
//     create a template or snapshot it does not know, the newest manifest
//     of it is brought from the repository: layers fetched and verified,
//     the VMM snapshot relocated to this node's boot files, the record
//     written last (import.go, templates.go).
//
// The node is reached through Node, an interface defined here: the records
// it keeps are its own.
package replica

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"

	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/snapshot/repo/upload"
	"github.com/agentenv/agentenv/template"
	"github.com/agentenv/agentenv/vmm"
)

// Uploads is the repository's upload queue (reponode.Node).
type Uploads interface {
	Commit(ctx context.Context, j upload.Job) error
	Status(name string) (upload.Status, bool)
	Forget(name string) error
	// Cancel drops a queued job, stopping an attempt in flight.
	Cancel(name string) error
	// Queued lists the jobs in the queue.
	Queued() []upload.Status
}

// Remote is the repository's read side (reponode.Node).
type Remote interface {
	Manifests(ctx context.Context) ([]string, error)
	Manifest(ctx context.Context, name string) (*repo.Manifest, error)
	Fetch(ctx context.Context, l repo.Layer, dir string) (string, error)
	ReadSmall(ctx context.Context, b repo.Blob, limit int64) ([]byte, error)
	// ReadPack reads a manifest's memory working-set pack, verified.
	ReadPack(ctx context.Context, b repo.Blob) ([]byte, error)
	// LazyURL names l, read for use (repo.UseRootfs or UseMemory), for
	// the storage daemon to read lazily through the node's layer socket
	// ("" when the node serves none: fetch it whole).
	LazyURL(l repo.Layer, use string) string
}

// Node is what the replica needs of the node it serves.
type Node interface {
	// Holds reports whether the node has a record of sandbox id.
	Holds(id string) bool
	// AdoptPaused records a sandbox brought from the repository as paused
	// here and registers it (its files are in place).
	AdoptPaused(p Paused) error
	// Snapshot returns a snapshot by id or name (errdefs.ErrNotFound).
	Snapshot(idOrName string) (snapshot.Record, error)
	// PutSnapshot records a snapshot brought from the repository (its
	// files are in place).
	PutSnapshot(r snapshot.Record) error
	// Template returns a template serving here by id or name.
	Template(idOrName string) (*template.Template, error)
	// Builder is the node's template builder (an error when builds are
	// off: no template is brought then).
	Builder() (*template.Builder, error)
	// FetchLater has the remote layers an image config names fetched
	// whole once the VM restoring from it answered.
	FetchLater(imageConfig string)
}

// Sandbox is a paused sandbox as a commit sees it.
type Sandbox struct {
	ID, TemplateID string
	// Dir is the sandbox's directory, Gen the generation the pause ended.
	Dir string
	Gen int
	// Snapshot is the pause's VMM snapshot directory, RootfsImage the
	// image config of its sealed root disk ("" when the disk is no layer
	// stack).
	Snapshot, RootfsImage string
	// Drives counts its extra drives (the repository carries root disks
	// only).
	Drives int
	// Record is the node's record of it, carried in the manifest's config
	// for the node that brings it (encoded as JSON).
	Record any
}

// Paused is a sandbox brought from the repository, recorded paused here by
// Node.AdoptPaused.
type Paused struct {
	ID string
	// Record is the record its node committed (JSON), to be placed here:
	// Dir, Gen, Snapshot and RootfsImage replace the committed ones; what
	// named its VM there (process, slot, devices, memory) is dropped.
	Record                     json.RawMessage
	Dir, Snapshot, RootfsImage string
	Gen                        int
}

// Options configure a Replica.
type Options struct {
	// Uploads, when set, receives the commits; nil keeps everything on
	// this node.
	Uploads Uploads
	// Remote, when set, brings what other nodes committed.
	Remote Remote
	// DataDir is the node's data directory (sandboxes/, snapshots/ and
	// templates/ in it).
	DataDir string
	// LazyMemory names the memory layers of what is brought by the layer
	// socket's URLs too, like the rootfs layers: where the node maps
	// memory from the storage daemon's exports, which read them lazily
	// (disk/lazymemory.go). Else they are fetched whole first (a VMM maps
	// a file).
	LazyMemory bool
	// Driver is the node's VMM driver: a brought snapshot is relocated to
	// this node's boot files by it (vmm.Relocator).
	Driver vmm.Driver
	Logger *slog.Logger
}

// Replica is a node's side of the snapshot repository.
type Replica struct {
	cfg  Options
	node Node
	log  *slog.Logger
	// importMu serialises bringing sandboxes, snapshots and templates: one
	// fetch per id, never two into one directory.
	importMu sync.Mutex
}

// New returns the replica of node.
func New(opts Options, node Node) *Replica {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Replica{cfg: opts, node: node, log: opts.Logger.With("component", "replica")}
}

// Imports reports whether the replica brings what other nodes committed.
func (r *Replica) Imports() bool { return r.cfg.Remote != nil }

// lazyFailures is the optional capability of a Remote to say why reads of
// a layer it serves lazily failed (reponode.Node.LazyFailure).
type lazyFailures interface{ LazyFailure(ref string) error }

// LayerFailure is the last failed lazy read of the layer ref names (a
// LazyURL); nil when none failed lately or the Remote cannot say.
func (r *Replica) LayerFailure(ref string) error {
	if lf, ok := r.cfg.Remote.(lazyFailures); ok {
		return lf.LazyFailure(ref)
	}
	return nil
}
