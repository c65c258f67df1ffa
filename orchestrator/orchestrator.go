// Package orchestrator runs the sandboxes of one node: a per-sandbox state
// machine (starting, running, pausing, paused, resuming, killing) safe under
// concurrent calls, creation by restoring a template snapshot, pause by
// snapshotting and releasing the VM and its network slot, resume by
// restoring that snapshot, TTLs with auto-pause or kill, and persistence of
// every sandbox in the node's store.
//
// # Durability rules
//
// The node promises that a sandbox loses nothing, across a crash (kill -9)
// of aenvd at any point. The rules that keep the promise:
//
//   - Every file a record points to is complete on disk before the record is
//     written: small files through internal/atomicfile (temp, fsync, rename,
//     fsync the directory), VMM snapshots fsynced with atomicfile.SyncTree,
//     sealed layers by their writers, root disks by the storage daemon.
//   - A state transition is recorded before its side effect: "starting" (with
//     its directory) before any resource is taken; the VM generation before
//     the VMM starts and its pid + start time right after; "pausing" before
//     the vCPUs stop; "paused" (pointing at the complete snapshot and the
//     sealed disk) before the VMM is stopped; a snapshot's new disk layer
//     list before the VM continues; "killing" before anything is removed.
//   - Recovery at startup (Recover, then New) walks every intermediate
//     state and finishes or rolls back each: a create is rolled back, a
//     pause whose VMM still runs is finished, a resume whose VMM never ran
//     goes back to paused, a kill is finished, a paused sandbox's leftover
//     VMM and device are removed.
//   - Nothing without an owner survives a start: VMM processes under the
//     data directory that no record owns (by pid and start time), storage
//     devices no record holds, and sandbox and snapshot directories without
//     a record are removed, and each removal is logged.
//   - A sandbox is removed only by an explicit kill (or its timeout). A
//     failed pause leaves it running; graceful shutdown never kills.
//
// Create, pause, resume, kill, the capture of a snapshot and fork are
// package lifecycle's verbs, stage lists the orchestrator runs under a
// sandbox's operation lock on its registry entry (live.go); recovery runs
// the pause and the kill on the VMs it adopts.
//
// Fault points (failpoints.go, and lifecycle's) sit between the durable steps; the crash
// matrix in api/e2e kills aenvd at each one and checks the sandbox.
//
// Every VM (a sandbox's create or resume, a fork child, a template's first
// boot, a build VM) is brought up by package sandbox's one sequence of
// stages. Disks live on the storage daemon (package disk: layers + a fresh
// upper per VM; a seal restacks the upper into a layer).
package orchestrator

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/agentenv/agentenv/lifecycle"
	"github.com/agentenv/agentenv/recovery"
	"github.com/agentenv/agentenv/telemetry"
	"github.com/agentenv/agentenv/template/catalog"

	"github.com/agentenv/agentenv/disk"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/memimage"
	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/store"
	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/volume"
	"github.com/agentenv/agentenv/warmpool"
	"github.com/prometheus/client_golang/prometheus"
)

const (
	nicID = "eth0"
)

// Errors callers map to HTTP statuses: the node's one error vocabulary.
// Errors of the layers below are wrapped into these where they mean the
// same for a client (a full slot range or a full storage daemon is
// ErrCapacity); anything else is an internal failure (500), whatever the
// lower layer called it.
var (
	ErrNotFound = errdefs.ErrNotFound // 404
	ErrConflict = errdefs.ErrConflict // 409
	ErrInvalid  = errdefs.ErrInvalid  // 400
	ErrCapacity = errdefs.ErrCapacity // 503 with Retry-After
	ErrLimit    = errdefs.ErrLimit    // 429 with Retry-After
)

// Options configure an Orchestrator. Driver, Network and Store are owned by
// the caller.
type Options struct {
	DataDir string
	Driver  vmm.Driver
	Network *network.Manager
	Store   *store.Store
	// Storage is the storage daemon serving the node's disks (required):
	// aenv-storaged's client or the daemon in process (disk.StartLocal).
	Storage disk.Devices
	// StorageBackend names it for the node's description (default
	// "storaged").
	StorageBackend string
	// StoragePoolLow and StoragePoolHigh are the watermarks of the daemon's
	// warm pool of root disks per template (zero: no pool).
	StoragePoolLow, StoragePoolHigh int
	VCPUs                           int
	MemoryMiB                       int
	DefaultUser                     string
	// MaxLayers is the memory or rootfs chain depth above which a paused
	// sandbox's own layers are merged (default memimage.DefaultMaxLayers).
	MaxLayers int
	// Prefetch records each memory image's working set and reads it ahead
	// while a VM restores from the image (memimage/workingset.go).
	Prefetch bool
	// FlattenPaused flattens a paused sandbox's memory image in the
	// background so that its resume maps one file (memimage/flatten.go).
	FlattenPaused bool
	// MemoryDevices maps restored VMs' memory from the storage daemon's
	// shared ublk device of the image's layer stack where the node can
	// (disk/memory.go); elsewhere, and when false, from flattened files.
	MemoryDevices bool
	// Remote, when set, is the repository's read side: rootfs layers an
	// import left remote are fetched from it (disk/lazy.go). The repository
	// itself joins as hooks (AttachReplica).
	Remote disk.Fetcher
	// Groups, when set, confines every VMM in a control group of its own
	// (named as the VM); groups no running sandbox owns are removed at start.
	Groups sandbox.Groups
	// VMMUIDBase, when not zero, confines every VMM of a driver that can
	// (vmm.Confiner): the VM in network slot N runs as uid and gid
	// VMMUIDBase+N, which no other VM of the node holds meanwhile.
	VMMUIDBase uint32
	// VolumeSizeMiB is the size of a volume whose create names none (zero:
	// volume.DefaultSizeMiB).
	VolumeSizeMiB int
	// VMMPool configures the warm pool of VMM processes (pool.go); High
	// zero turns it off.
	VMMPool PoolOptions
	// Recovered holds the VMs recovery.Recover took over, re-adopted as running
	// sandboxes (Network must keep their slots: Recovered.Slots).
	Recovered *recovery.Recovered
	// Admission, when set, decides whether the node takes a create, resume
	// or fork (package admission; admission.go).
	Admission  Admitter
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// PoolOptions configure the warm pool of VMM processes (warmpool.Options).
type PoolOptions struct {
	Low, High, ReserveMiB int
	// Templates names the templates (ids or names) pooled.
	Templates []string
}

// Orchestrator owns the node's sandboxes.
type Orchestrator struct {
	cfg   Options
	drv   vmm.Driver
	nets  *network.Manager
	store *store.Store
	log   *slog.Logger
	m     *telemetry.Ops

	mu        sync.Mutex // guards sandboxes
	sandboxes map[string]*instance
	// catalog is the node's templates (package template/catalog).
	catalog *catalog.Catalog
	// refMu orders resolving a create's source and registering the new
	// sandbox against the in-use check of a snapshot or template deletion,
	// so a deletion sees every sandbox that will use what it deletes.
	refMu sync.Mutex
	matMu sync.Mutex // serialises memory imports and materializations (memimage.Options.Mu)
	bg    sync.WaitGroup
	// disks are the node's disks on the storage daemon (package disk),
	// including the lazy rootfs layers it moves onto local files; vms what
	// a VM bring-up uses (sandbox.Start).
	disks *disk.Manager
	vms   sandbox.Deps

	events sandbox.Hub // lifecycle event subscribers (sandbox/events.go)
	// journal writes every sandbox record, and is the one writer of a
	// record's state (sandbox/journal.go).
	journal *sandbox.Journal
	hooks   hookList // the verbs' hooks (hooks.go)
	// verbs are the sandbox's pause, kill and snapshot (package lifecycle).
	verbs *lifecycle.Verbs
	// volumes are the node's volumes (volumes.go).
	volumes *volume.Store
	// pool is the warm pool of VMM processes (pool.go); nil when off.
	pool *warmpool.Pool
	// mem is the node's guest memory images (package memimage).
	mem *memimage.Images
	// memDev, when set, maps restored VMs' memory from shared devices
	// (disk/memory.go); memWhy says why it is not. Both chosen once in New.
	memDev *disk.MemoryDevices
	memWhy string
	// watchCtx bounds the watchers of running VMs (exited.go); unwatch
	// ends them when the node stops.
	watchCtx context.Context
	unwatch  context.CancelFunc
}

// instance is one sandbox's live state. op serialises lifecycle operations
// (create, pause, resume, snapshot, kill, timeout changes): only its holder
// changes the record. mu guards the fields below it for readers that do not
// take op (Get, List, the proxy's lookups): every write holds both.
type instance struct {
	op    sync.Mutex
	mu    sync.Mutex
	rec   sandbox.Record
	vm    *sandbox.VM // the running VM and its slot; nil unless running
	timer *time.Timer
	gone  bool
}

// machine returns the running VMM (nil when none); mu held.
func (s *instance) machine() vmm.Machine {
	if s.vm == nil {
		return nil
	}
	return s.vm.Machine
}

// slot returns the running VM's network slot (nil when none); mu held.
func (s *instance) slot() *network.Slot {
	if s.vm == nil {
		return nil
	}
	return s.vm.Slot
}

// New returns an orchestrator and loads the persisted sandboxes (see
// recovery.go): paused ones are kept, running ones Recover took over are
// re-adopted, interrupted transitions are finished or rolled back, and
// whatever no record owns is removed.
func New(ctx context.Context, opts Options) (*Orchestrator, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.DefaultUser == "" {
		opts.DefaultUser = "user"
	}
	o := &Orchestrator{cfg: opts, drv: opts.Driver, nets: opts.Network, store: opts.Store,
		log: opts.Logger.With("component", "orchestrator"), m: telemetry.NewOps(opts.Registerer),
		sandboxes: map[string]*instance{}}
	o.watchCtx, o.unwatch = context.WithCancel(context.Background())
	o.journal = &sandbox.Journal{Store: opts.Store, Publish: o.events.Published, Log: o.log}
	o.vms = sandbox.Deps{Driver: opts.Driver, Slots: opts.Network, Groups: opts.Groups, Identities: vmmIdentities(opts, o.log)}
	disks, err := disk.New(ctx, disk.Options{Devices: opts.Storage, Backend: opts.StorageBackend, Driver: opts.Driver,
		PoolLow: opts.StoragePoolLow, PoolHigh: opts.StoragePoolHigh, MemoryDevices: opts.MemoryDevices, Remote: opts.Remote,
		Moved: o.lazyMoved, Registerer: opts.Registerer, Logger: o.log})
	if err != nil {
		return nil, fmt.Errorf("orchestrator: %w", err)
	}
	o.disks = disks
	o.verbs = &lifecycle.Verbs{Disks: disks, Store: opts.Store, Ops: o.m, Log: o.log, DataDir: opts.DataDir}
	o.catalog = o.newCatalog()
	if o.memDev, o.memWhy = disks.Memory(); !opts.MemoryDevices {
		o.memWhy = "storage.memory_devices is off"
	}
	o.mem = newImages(o)
	o.registerMemoryMetrics(opts.Registerer)
	o.log.Info("root disk backend", "backend", o.disks.Backend(), "transport", o.DiskTransport())
	for _, d := range []string{"sandboxes", "snapshots"} {
		if err := os.MkdirAll(filepath.Join(opts.DataDir, d), 0o700); err != nil {
			return nil, fmt.Errorf("orchestrator: %w", err)
		}
	}
	vols, err := volume.Open(filepath.Join(opts.DataDir, "volumes"), volume.Options{DefaultSizeMiB: opts.VolumeSizeMiB, Logger: o.log})
	if err != nil {
		return nil, fmt.Errorf("orchestrator: %w", err)
	}
	o.volumes = vols
	if err := o.load(ctx); err != nil {
		return nil, err
	}
	if o.pool = o.newPool(); o.pool != nil {
		o.registerPoolMetrics(opts.Registerer)
		o.pool.Start(ctx)
	}
	o.localizeAll(ctx)
	mode, why := o.memoryMode()
	o.log.Info("guest memory images", "mode", mode, "why", why)
	return o, nil
}

// DiskBackend names the storage daemon the node's disks live on: storaged
// (aenv-storaged) or local (in process).
func (o *Orchestrator) DiskBackend() string { return o.disks.Backend() }

// DiskTransport names how the node's VMs reach their root disks: a kernel
// block device (ublk, nbd) or NBD over the storage daemon's socket.
func (o *Orchestrator) DiskTransport() string { return o.disks.Transport() }

// Close drains the warm pool, stops the fetches of lazy rootfs layers (a
// restart resumes them) and the flattens of paused memory, and waits for
// the background work (memory flattening, compaction) the orchestrator
// started.
func (o *Orchestrator) Close() {
	o.unwatch()
	if o.pool != nil {
		o.pool.Close(context.Background())
	}
	o.disks.Close()
	o.mem.Close()
	o.bg.Wait()
}

// goBackground runs f as background work Close waits for.
func (o *Orchestrator) goBackground(f func()) {
	o.bg.Add(1)
	go func() {
		defer o.bg.Done()
		f()
	}()
}

func (o *Orchestrator) lookup(id string) (*instance, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s, ok := o.sandboxes[id]
	if !ok {
		return nil, fmt.Errorf("sandbox %q: %w", id, ErrNotFound)
	}
	return s, nil
}

// lockOp takes the sandbox's operation lock; ErrNotFound if it is gone.
func (o *Orchestrator) lockOp(id string) (*instance, error) {
	s, err := o.lookup(id)
	if err != nil {
		return nil, err
	}
	s.op.Lock()
	if s.gone {
		s.op.Unlock()
		return nil, fmt.Errorf("sandbox %q: %w", id, ErrNotFound)
	}
	return s, nil
}

// Get returns a copy of the sandbox's record.
func (o *Orchestrator) Get(id string) (sandbox.Record, error) {
	s, err := o.lookup(id)
	if err != nil {
		return sandbox.Record{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rec, nil
}

// List returns copies of every record, newest first.
func (o *Orchestrator) List() []sandbox.Record {
	o.mu.Lock()
	all := make([]*instance, 0, len(o.sandboxes))
	for _, s := range o.sandboxes {
		all = append(all, s)
	}
	o.mu.Unlock()
	out := make([]sandbox.Record, 0, len(all))
	for _, s := range all {
		s.mu.Lock()
		out = append(out, s.rec)
		s.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].StartedAt.Equal(out[j].StartedAt) {
			return out[i].StartedAt.After(out[j].StartedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Slot returns the network slot and VM generation of a running sandbox;
// ErrConflict when it is not running.
func (o *Orchestrator) Slot(id string) (*network.Slot, int, error) {
	s, err := o.lookup(id)
	if err != nil {
		return nil, 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.rec.State != sandbox.Running || s.slot() == nil {
		return nil, 0, fmt.Errorf("sandbox %s is %s: %w", id, s.rec.State, ErrConflict)
	}
	return s.slot(), s.rec.Gen, nil
}

// Counts reports how many sandboxes are in each state.
func (o *Orchestrator) Counts() map[sandbox.State]int {
	out := map[sandbox.State]int{}
	for _, r := range o.List() {
		out[r.State]++
	}
	return out
}

// vmmIdentities gives each VM's VMM the identity of its network slot, when
// the node confines VMMs and its driver can.
func vmmIdentities(opts Options, log *slog.Logger) func(*network.Slot) vmm.Identity {
	if opts.VMMUIDBase == 0 {
		log.Warn("VMMs run as root: vmm.uid_base is 0")
		return nil
	}
	if c, ok := opts.Driver.(vmm.Confiner); !ok || !c.Confines() {
		log.Info("VMMs are not given identities of their own: the driver confines them itself or not at all", "driver", opts.Driver.Name())
		return nil
	}
	log.Info("VMMs run confined, each as its own uid", "uid_base", opts.VMMUIDBase)
	return func(s *network.Slot) vmm.Identity {
		id := opts.VMMUIDBase + uint32(s.Index)
		return vmm.Identity{UID: id, GID: id}
	}
}
