// Package orchestrator runs the sandboxes of one node: a per-sandbox state
// machine (starting, running, pausing, paused, resuming, killing) safe under
// concurrent calls, creation by restoring a template snapshot, pause by
// snapshotting and releasing the VM and its network slot, resume by
// restoring that snapshot, TTLs with auto-pause or kill, and persistence of
// every sandbox in the node's store.
//
// A graceful shutdown pauses running sandboxes (by default). After a crash
// or kill -9, paused sandboxes stay paused and running ones keep running:
// Recover adopts their VMM processes, the network manager keeps their slots
// through its startup cleanup, and New re-adopts both (policy and timeout
// set again); a sandbox that cannot run on is snapshotted and kept paused.
//
// Root disks come from the storage daemon (layers + a fresh upper per
// sandbox over NBD; pause seals the upper by restack) or, without a daemon,
// from a sparse copy of the template's rootfs file per sandbox.
package orchestrator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/storage/daemon/client"
	"github.com/agentenv/agentenv/store"
	"github.com/agentenv/agentenv/vmm"
	"github.com/prometheus/client_golang/prometheus"
)

const (
	rootfsDrive = "rootfs"
	nicID       = "eth0"
	// envdVersion is reported until the agent's own /init answer is known.
	envdVersion = "0.6.4"
)

// State is a sandbox's lifecycle state.
type State string

// The states of a sandbox.
const (
	Starting State = "starting"
	Running  State = "running"
	Pausing  State = "pausing"
	Paused   State = "paused"
	Resuming State = "resuming"
	Killing  State = "killing"
)

// Errors callers map to HTTP statuses.
var (
	ErrNotFound = errors.New("not found")
	ErrConflict = errors.New("conflict")
	ErrInvalid  = errors.New("invalid request")
)

// Record is the persisted description of a sandbox.
type Record struct {
	ID          string            `json:"id"`
	TemplateID  string            `json:"templateID"`
	State       State             `json:"state"`
	Metadata    map[string]string `json:"metadata,omitempty"`
	EnvVars     map[string]string `json:"envVars,omitempty"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	AutoPause   bool              `json:"autoPause"`
	AutoResume  bool              `json:"autoResume"`
	Secure      bool              `json:"secure"`
	AccessToken string            `json:"accessToken,omitempty"`
	// GuestToken is the access token the guest's agent holds now: the one
	// of the sandbox a snapshot was taken from until this sandbox's first
	// /init replaces it, then AccessToken. A re-init must present it.
	GuestToken string `json:"guestToken,omitempty"`
	// TrafficToken, when set, must accompany proxied traffic to ports other
	// than the agent's (allowPublicTraffic false).
	TrafficToken string `json:"trafficToken,omitempty"`
	VCPUs        int    `json:"vcpus"`
	MemoryMiB    int    `json:"memoryMiB"`
	DiskMiB      int    `json:"diskMiB"`
	EnvdVersion  string `json:"envdVersion"`
	Dir          string `json:"dir"`
	Rootfs       string `json:"rootfs,omitempty"` // file mode
	// RootfsImage is the image config the daemon device is created from
	// (daemon mode); Device is the live device while the VM runs.
	RootfsImage string `json:"rootfsImage,omitempty"`
	Device      uint32 `json:"device,omitempty"`
	HasDevice   bool   `json:"hasDevice,omitempty"`
	Snapshot    string `json:"snapshot,omitempty"` // set while paused
	// Memory is the layered memory image the running VM maps (empty when
	// its snapshot carried the memory whole).
	Memory MemoryImage    `json:"memory,omitempty"`
	Gen    int            `json:"gen"` // bumps on every (re)start of the VM
	PID    int            `json:"pid,omitempty"`
	Slot   int            `json:"slot,omitempty"` // network slot index while the VM runs
	Policy network.Policy `json:"policy"`
}

// Options configure an Orchestrator. Driver, Network and Store are owned by
// the caller.
type Options struct {
	DataDir string
	Driver  vmm.Driver
	Network *network.Manager
	Store   *store.Store
	// Storage is the storage daemon serving root disks; nil uses a sparse
	// copy of the template's rootfs file per sandbox.
	Storage *client.Client
	// StoragePoolLow and StoragePoolHigh are the watermarks of the daemon's
	// warm pool of root disks per template (zero: no pool).
	StoragePoolLow, StoragePoolHigh int
	VCPUs                           int
	MemoryMiB                       int
	DefaultUser                     string
	// MaxLayers is the memory or rootfs chain depth above which a paused
	// sandbox's own layers are merged (default DefaultMaxLayers).
	MaxLayers int
	// Recovered holds the VMs Recover took over, re-adopted as running
	// sandboxes (Network must keep their slots: Recovered.Slots).
	Recovered  *Recovered
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Orchestrator owns the node's sandboxes.
type Orchestrator struct {
	cfg   Options
	drv   vmm.Driver
	nets  *network.Manager
	store *store.Store
	sd    *client.Client
	log   *slog.Logger
	m     *metrics

	mu        sync.Mutex
	sandboxes map[string]*sandbox
	templates map[string]*Template
	matMu     sync.Mutex // serialises memory imports and materializations
	warmed    sync.Map   // root disk image configs given a warm pool
}

type sandbox struct {
	op    sync.Mutex // serialises lifecycle operations
	mu    sync.Mutex // guards the fields below
	rec   Record
	vm    vmm.Machine
	slot  *network.Slot
	timer *time.Timer
	gone  bool
}

// New returns an orchestrator and loads the persisted sandboxes: paused ones
// are kept; any other (Recover, run before the network manager starts, turns
// re-adoptable running ones into paused ones) has its VMM process stopped
// and its record dropped.
func New(ctx context.Context, opts Options) (*Orchestrator, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.DefaultUser == "" {
		opts.DefaultUser = "user"
	}
	o := &Orchestrator{cfg: opts, drv: opts.Driver, nets: opts.Network, store: opts.Store, sd: opts.Storage,
		log: opts.Logger.With("component", "orchestrator"), m: newMetrics(opts.Registerer),
		sandboxes: map[string]*sandbox{}, templates: map[string]*Template{}}
	if err := os.MkdirAll(filepath.Join(opts.DataDir, "sandboxes"), 0o755); err != nil {
		return nil, fmt.Errorf("orchestrator: %w", err)
	}
	if err := o.load(ctx); err != nil {
		return nil, err
	}
	o.log.Info("guest memory images", "mode", MemoryMode, "why", MemoryReason)
	return o, nil
}

func (o *Orchestrator) load(ctx context.Context) error {
	recs, err := store.ListAll[Record](o.store, store.Sandboxes)
	if err != nil {
		return fmt.Errorf("orchestrator: load sandboxes: %w", err)
	}
	for _, r := range recs {
		if m, ok := o.cfg.Recovered.machine(r.ID); ok && r.State == Running {
			o.adoptRunning(ctx, r, m)
			continue
		}
		if r.State == Paused && r.Snapshot != "" {
			if _, err := os.Stat(r.Snapshot); err == nil {
				o.sandboxes[r.ID] = &sandbox{rec: r}
				o.log.Info("kept paused sandbox", "sandbox", r.ID)
				continue
			}
		}
		o.log.Warn("dropping sandbox that cannot be re-adopted", "sandbox", r.ID, "state", r.State)
		if err := dropRecord(ctx, o.store, o.sd, r); err != nil {
			return err
		}
	}
	return nil
}

// CreateOptions describe a new sandbox.
type CreateOptions struct {
	TemplateID string
	Timeout    time.Duration
	AutoPause  bool
	AutoResume bool
	Secure     bool
	Metadata   map[string]string
	EnvVars    map[string]string
	Policy     network.Policy
	// PrivateTraffic requires a traffic access token on the proxy.
	PrivateTraffic bool
}

// templateByID returns a registered template (not a snapshot) by id.
func (o *Orchestrator) templateByID(id string) (*Template, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	t, ok := o.templates[id]
	return t, ok
}

// Template returns a committed template by id.
func (o *Orchestrator) Template(id string) (*Template, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	t, ok := o.templates[id]
	if !ok {
		t, ok = o.templateByName(id) // a built template's name (build.go)
	}
	if !ok {
		return nil, fmt.Errorf("template %q: %w", id, ErrNotFound)
	}
	return t, nil
}

// Templates lists the committed templates.
func (o *Orchestrator) Templates() []Template {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]Template, 0, len(o.templates))
	for _, t := range o.templates {
		out = append(out, *t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Create restores the template's (or snapshot's) snapshot into a new sandbox.
func (o *Orchestrator) Create(ctx context.Context, opts CreateOptions) (rec Record, err error) {
	t, err := o.source(opts.TemplateID)
	if err != nil {
		return rec, err
	}
	if _, isTemplate := o.templateByID(t.ID); isTemplate {
		if err := o.ensureMemoryBase(t); err != nil {
			o.log.Warn("template memory stays unlayered", "template", t.ID, "err", err)
		}
		o.warmRootfs(ctx, t)
	}
	if opts.Timeout <= 0 {
		return rec, fmt.Errorf("create: timeout must be positive: %w", ErrInvalid)
	}
	if err := network.ValidatePolicy(opts.Policy); err != nil {
		return rec, fmt.Errorf("create: network policy: %w: %w", err, ErrInvalid)
	}
	done := o.m.observe("create")
	defer func() { done(err) }()
	id, err := newID()
	if err != nil {
		return rec, err
	}
	dir := filepath.Join(o.cfg.DataDir, "sandboxes", id)
	s := &sandbox{rec: Record{
		ID: id, TemplateID: t.ID, State: Starting, Metadata: opts.Metadata, EnvVars: opts.EnvVars,
		AutoPause: opts.AutoPause, AutoResume: opts.AutoResume, Secure: opts.Secure,
		VCPUs: t.VCPUs, MemoryMiB: t.MemoryMiB, DiskMiB: t.DiskMiB, EnvdVersion: t.EnvdVersion,
		Dir: dir, Policy: opts.Policy, GuestToken: t.GuestToken,
	}}
	if o.sd != nil {
		s.rec.RootfsImage = t.RootfsImage
	} else {
		s.rec.Rootfs = filepath.Join(dir, "rootfs.ext4")
	}
	if opts.Secure {
		if s.rec.AccessToken, err = randomHex(32); err != nil {
			return rec, err
		}
	}
	if opts.PrivateTraffic {
		if s.rec.TrafficToken, err = randomHex(32); err != nil {
			return rec, err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return rec, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	fail := func(err error) (Record, error) {
		_ = os.RemoveAll(dir)
		return Record{}, fmt.Errorf("create sandbox %s: %w", id, err)
	}
	if o.sd == nil {
		if err := sparseCopy(ctx, t.Rootfs, s.rec.Rootfs); err != nil {
			return fail(err)
		}
	}
	lap := o.m.stage("create")
	if err := o.startVM(ctx, s, t.Snapshot, lap); err != nil {
		return fail(err)
	}
	now := time.Now().UTC()
	s.rec.StartedAt, s.rec.EndAt, s.rec.State = now, now.Add(opts.Timeout), Running
	if err := o.store.Put(store.Sandboxes, id, s.rec); err != nil {
		o.stopVM(ctx, s)
		o.releaseDevice(ctx, s)
		return fail(err)
	}
	o.mu.Lock()
	o.sandboxes[id] = s
	o.mu.Unlock()
	s.mu.Lock()
	o.armTimer(s)
	rec = s.rec
	s.mu.Unlock()
	o.log.Info("sandbox created", "sandbox", id, "template", t.ID)
	return rec, nil
}

// startVM restores snapshotDir with the sandbox's rootfs and a fresh slot,
// waits for the agent and initialises it. On failure nothing is left running.
// lap records the stages (network, vmm_restore, agent).
func (o *Orchestrator) startVM(ctx context.Context, s *sandbox, snapshotDir string, lap func(string)) (err error) {
	slot, err := o.nets.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("network slot: %w", err)
	}
	var vm vmm.Machine
	defer func() {
		if err != nil {
			if vm != nil {
				_ = vm.Stop(context.WithoutCancel(ctx))
			}
			o.releaseDevice(ctx, s)
			_ = o.nets.Release(context.WithoutCancel(ctx), slot)
		}
	}()

	if !isZeroPolicy(s.rec.Policy) {
		if err := slot.SetPolicy(ctx, s.rec.Policy); err != nil {
			return fmt.Errorf("network policy: %w", err)
		}
	}
	tap, err := slot.OpenTap()
	if err != nil {
		return fmt.Errorf("tap: %w", err)
	}
	defer tap.Close()
	lap("network")
	drive, err := o.rootfsDrive(ctx, s)
	if err != nil {
		return err
	}
	lap("storage")
	mem, err := o.restoreMemory(ctx, snapshotDir)
	if err != nil {
		return err
	}
	lap("memory")
	s.rec.Gen++
	vm, err = o.drv.Restore(ctx, vmm.RestoreConfig{
		ID: fmt.Sprintf("%s-%d", s.rec.ID, s.rec.Gen), SnapshotDir: snapshotDir, MemoryFile: mem.File,
		RunDir: filepath.Join(s.rec.Dir, fmt.Sprintf("run-%d", s.rec.Gen)),
		Drives: []vmm.Drive{drive},
		NICs:   []vmm.NIC{{ID: nicID, MAC: slot.Guest().MAC.String(), Tap: tap}},
	})
	if err != nil {
		vm = nil
		return fmt.Errorf("restore: %w", err)
	}
	lap("vmm_restore")
	if err := waitAgent(ctx, slot, time.Minute); err != nil {
		console, _ := os.ReadFile(vm.Info().ConsoleLog)
		o.log.Error("restored guest's agent is silent", "sandbox", s.rec.ID, "console_tail", string(tail(console, 3000)))
		return fmt.Errorf("%w (guest console: %s)", err, strings.TrimSpace(string(tail(console, 600))))
	}
	req := initRequest{EnvVars: s.rec.EnvVars, DefaultUser: o.defaultUser(s.rec.TemplateID)}
	if s.rec.AccessToken != "" || s.rec.GuestToken != "" {
		req.AccessToken = &s.rec.AccessToken // "" clears a token the snapshot's sandbox had
	}
	if err := initAgent(ctx, slot, s.rec.GuestToken, req); err != nil {
		return err
	}
	s.rec.GuestToken = s.rec.AccessToken
	lap("agent")
	o.log.Debug("vm started", "sandbox", s.rec.ID, "gen", s.rec.Gen, "slot", slot.Name, "pid", vm.Info().PID, "memory", mem.File)
	s.mu.Lock()
	s.vm, s.slot, s.rec.PID, s.rec.Memory, s.rec.Slot = vm, slot, vm.Info().PID, mem, slot.Index
	s.mu.Unlock()
	return nil
}

// stopVM stops the machine and releases the slot of s (any state).
func (o *Orchestrator) stopVM(ctx context.Context, s *sandbox) {
	s.mu.Lock()
	vm, slot := s.vm, s.slot
	s.vm, s.slot, s.rec.PID = nil, nil, 0
	s.mu.Unlock()
	if vm != nil {
		if err := vm.Stop(context.WithoutCancel(ctx)); err != nil {
			o.log.Warn("stop vm", "sandbox", s.rec.ID, "err", err)
		}
	}
	if slot != nil {
		if err := o.nets.Release(context.WithoutCancel(ctx), slot); err != nil {
			o.log.Warn("release slot", "sandbox", s.rec.ID, "err", err)
		}
	}
}

func (o *Orchestrator) lookup(id string) (*sandbox, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s, ok := o.sandboxes[id]
	if !ok {
		return nil, fmt.Errorf("sandbox %q: %w", id, ErrNotFound)
	}
	return s, nil
}

// lockOp takes the sandbox's operation lock; ErrNotFound if it is gone.
func (o *Orchestrator) lockOp(id string) (*sandbox, error) {
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
func (o *Orchestrator) Get(id string) (Record, error) {
	s, err := o.lookup(id)
	if err != nil {
		return Record{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rec, nil
}

// List returns copies of every record, newest first.
func (o *Orchestrator) List() []Record {
	o.mu.Lock()
	all := make([]*sandbox, 0, len(o.sandboxes))
	for _, s := range o.sandboxes {
		all = append(all, s)
	}
	o.mu.Unlock()
	out := make([]Record, 0, len(all))
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
	if s.rec.State != Running || s.slot == nil {
		return nil, 0, fmt.Errorf("sandbox %s is %s: %w", id, s.rec.State, ErrConflict)
	}
	return s.slot, s.rec.Gen, nil
}

// Kill stops the sandbox and removes everything it owns.
func (o *Orchestrator) Kill(ctx context.Context, id string) (err error) {
	s, err := o.lockOp(id)
	if err != nil {
		return err
	}
	defer s.op.Unlock()
	done := o.m.observe("kill")
	defer func() { done(err) }()
	o.setState(s, Killing)
	o.stopTimer(s)
	o.stopVM(ctx, s)
	o.releaseDevice(ctx, s)
	s.gone = true
	o.mu.Lock()
	delete(o.sandboxes, id)
	o.mu.Unlock()
	if err := os.RemoveAll(s.rec.Dir); err != nil {
		o.log.Warn("remove sandbox dir", "sandbox", id, "err", err)
	}
	if err := o.store.Delete(store.Sandboxes, id); err != nil {
		return fmt.Errorf("kill sandbox %s: %w", id, err)
	}
	o.log.Info("sandbox killed", "sandbox", id)
	o.collectForkSnapshot(s.rec.TemplateID)
	return nil
}

// Pause snapshots a running sandbox and releases its VM and slot.
func (o *Orchestrator) Pause(ctx context.Context, id string) (err error) {
	s, err := o.lockOp(id)
	if err != nil {
		return err
	}
	defer s.op.Unlock()
	if st := o.state(s); st != Running {
		return fmt.Errorf("pause sandbox %s: it is %s: %w", id, st, ErrConflict)
	}
	done := o.m.observe("pause")
	defer func() { done(err) }()
	o.setState(s, Pausing)
	vm := s.vm
	snapDir := filepath.Join(s.rec.Dir, fmt.Sprintf("snapshot-%d", s.rec.Gen))
	if err := vm.Pause(ctx); err != nil {
		o.setState(s, Running)
		return fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	diff := filepath.Join(s.rec.Dir, fmt.Sprintf("mem-%d.lsmt", s.rec.Gen))
	if err := o.captureMemory(ctx, s, vm, snapDir, diff); err != nil {
		_ = os.RemoveAll(snapDir)
		rerr := vm.Resume(context.WithoutCancel(ctx))
		o.setState(s, Running)
		return fmt.Errorf("pause sandbox %s: snapshot: %w", id, errors.Join(err, rerr))
	}
	o.stopTimer(s)
	o.stopVM(ctx, s)
	// Flatten the new image in the background, while nothing waits on it,
	// so a resume maps it at once (a resume that comes first waits for it).
	go func() {
		if _, err := o.restoreMemory(context.WithoutCancel(ctx), snapDir); err != nil {
			o.log.Warn("flatten memory after pause (the resume retries)", "sandbox", id, "err", err)
		}
	}()
	if err := o.sealRootfs(ctx, s); err != nil {
		// The VM is gone and its disk cannot be sealed: the sandbox is lost.
		o.releaseDevice(ctx, s)
		_ = os.RemoveAll(snapDir)
		o.dropLost(s)
		return fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	s.mu.Lock()
	old := s.rec.Snapshot
	s.rec.Snapshot, s.rec.State = snapDir, Paused
	rec := s.rec
	s.mu.Unlock()
	if old != "" && old != snapDir {
		_ = os.RemoveAll(old)
	}
	if err := o.store.Put(store.Sandboxes, id, rec); err != nil {
		return fmt.Errorf("pause sandbox %s: %w", id, err)
	}
	o.log.Info("sandbox paused", "sandbox", id)
	o.maybeCompact(rec)
	return nil
}

// dropLost forgets a sandbox whose state could not be kept.
func (o *Orchestrator) dropLost(s *sandbox) {
	s.gone = true
	o.mu.Lock()
	delete(o.sandboxes, s.rec.ID)
	o.mu.Unlock()
	_ = os.RemoveAll(s.rec.Dir)
	_ = o.store.Delete(store.Sandboxes, s.rec.ID)
	o.log.Error("sandbox lost", "sandbox", s.rec.ID)
}

// Connect makes sure the sandbox runs: a running one gets its end time
// extended to at least now+timeout; a paused one is resumed. resumed
// reports which.
func (o *Orchestrator) Connect(ctx context.Context, id string, timeout time.Duration) (rec Record, resumed bool, err error) {
	s, err := o.lockOp(id)
	if err != nil {
		return rec, false, err
	}
	defer s.op.Unlock()
	switch st := o.state(s); st {
	case Running:
		s.mu.Lock()
		if end := time.Now().UTC().Add(timeout); end.After(s.rec.EndAt) {
			s.rec.EndAt = end
			o.armTimer(s)
		}
		rec = s.rec
		s.mu.Unlock()
		return rec, false, o.store.Put(store.Sandboxes, id, rec)
	case Paused:
	default:
		return rec, false, fmt.Errorf("connect sandbox %s: it is %s: %w", id, st, ErrConflict)
	}
	done := o.m.observe("resume")
	defer func() { done(err) }()
	o.setState(s, Resuming)
	if err := o.startVM(ctx, s, s.rec.Snapshot, o.m.stage("resume")); err != nil {
		o.setState(s, Paused)
		return rec, false, fmt.Errorf("resume sandbox %s: %w", id, err)
	}
	s.mu.Lock()
	s.rec.State, s.rec.EndAt = Running, time.Now().UTC().Add(timeout)
	o.armTimer(s)
	rec = s.rec
	s.mu.Unlock()
	o.log.Info("sandbox resumed", "sandbox", id)
	return rec, true, o.store.Put(store.Sandboxes, id, rec)
}

// SetTimeout sets the end time to now+timeout (it may shorten it). When
// extendOnly, an earlier end than the current one is ignored.
func (o *Orchestrator) SetTimeout(id string, timeout time.Duration, extendOnly bool) error {
	s, err := o.lookup(id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.gone {
		s.mu.Unlock()
		return fmt.Errorf("sandbox %q: %w", id, ErrNotFound)
	}
	end := time.Now().UTC().Add(timeout)
	if !extendOnly || end.After(s.rec.EndAt) {
		s.rec.EndAt = end
		if s.rec.State == Running {
			o.armTimer(s)
		}
	}
	rec := s.rec
	s.mu.Unlock()
	return o.store.Put(store.Sandboxes, id, rec)
}

// SetPolicy replaces the sandbox's egress policy, in force at once when it
// runs and kept across pause and resume.
func (o *Orchestrator) SetPolicy(ctx context.Context, id string, p network.Policy) error {
	if err := network.ValidatePolicy(p); err != nil {
		return fmt.Errorf("network policy: %w: %w", err, ErrInvalid)
	}
	s, err := o.lockOp(id)
	if err != nil {
		return err
	}
	defer s.op.Unlock()
	s.mu.Lock()
	slot := s.slot
	s.mu.Unlock()
	if slot != nil {
		if err := slot.SetPolicy(ctx, p); err != nil {
			return fmt.Errorf("sandbox %s: network policy: %w", id, err)
		}
	}
	s.mu.Lock()
	s.rec.Policy = p
	rec := s.rec
	s.mu.Unlock()
	return o.store.Put(store.Sandboxes, id, rec)
}

func isZeroPolicy(p network.Policy) bool {
	return !p.DenyInternet && len(p.AllowOut) == 0 && len(p.DenyOut) == 0
}

// armTimer (re)starts the TTL timer; s.mu must be held.
func (o *Orchestrator) armTimer(s *sandbox) {
	if s.timer != nil {
		s.timer.Stop()
	}
	id := s.rec.ID
	s.timer = time.AfterFunc(time.Until(s.rec.EndAt), func() { o.expire(id) })
}

func (o *Orchestrator) stopTimer(s *sandbox) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
}

// expire runs when a sandbox's end time passed: pause when autoPause, else kill.
func (o *Orchestrator) expire(id string) {
	rec, err := o.Get(id)
	if err != nil || rec.State != Running || time.Now().Before(rec.EndAt) {
		return // gone, paused, or the end moved (a newer timer is armed)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if rec.AutoPause {
		err = o.Pause(ctx, id)
	} else {
		err = o.Kill(ctx, id)
	}
	if err != nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrConflict) {
		o.log.Error("sandbox timeout", "sandbox", id, "autoPause", rec.AutoPause, "err", err)
		return
	}
	o.log.Info("sandbox timed out", "sandbox", id, "autoPause", rec.AutoPause)
}

func (o *Orchestrator) state(s *sandbox) State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rec.State
}

func (o *Orchestrator) setState(s *sandbox, st State) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rec.State = st
}

// Shutdown pauses (pause true) or kills every running sandbox. Paused
// sandboxes stay on disk and in the store.
func (o *Orchestrator) Shutdown(ctx context.Context, pause bool) error {
	var errs []error
	for _, r := range o.List() {
		if r.State != Running {
			continue
		}
		var err error
		if pause {
			err = o.Pause(ctx, r.ID)
		}
		if !pause || err != nil {
			err = errors.Join(err, o.Kill(ctx, r.ID))
		}
		if err != nil && !errors.Is(err, ErrNotFound) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Counts reports how many sandboxes are in each state.
func (o *Orchestrator) Counts() map[State]int {
	out := map[State]int{}
	for _, r := range o.List() {
		out[r.State]++
	}
	return out
}

const idAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// newID returns 20 characters of [a-z0-9], as E2B's sandbox ids.
func newID() (string, error) {
	b := make([]byte, 20)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("sandbox id: %w", err)
	}
	for i := range b {
		b[i] = idAlphabet[int(b[i])%len(idAlphabet)]
	}
	return string(b), nil
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// killStale ends a VMM process left by a previous aenvd run, if pid still
// names a process whose command line carries the sandbox id.
func killStale(pid int, id string) {
	if pid <= 0 {
		return
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || !strings.Contains(string(cmdline), id) {
		return
	}
	if p, err := os.FindProcess(pid); err == nil {
		_ = p.Kill()
	}
}
