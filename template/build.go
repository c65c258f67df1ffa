package template

// Template builds (E2B's v2/v3 template API): a template is created first
// (POST /v3/templates: status "waiting"), then a build spec starts its build
// (fromImage or fromTemplate, steps, startCmd, readyCmd). Builds run in the
// background, one build VM at a time per node (others queue). Build state is
// persisted in the template record (store.Templates) so status survives a
// restart; a build a restart interrupted is marked as failed. Log entries go
// to a JSON-lines file per build.

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentenv/agentenv/guest/image"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/ids"
	"github.com/agentenv/agentenv/oci"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/store"
)

// Build statuses (E2B's names).
const (
	BuildWaiting  = "waiting"
	BuildBuilding = "building"
	BuildReady    = "ready"
	BuildError    = "error"
)

// Step names used in log entries besides the step numbers "1".."n" (E2B's).
const (
	StepBase     = "base"
	StepFinalize = "finalize"
)

// maxBuildLogs bounds the entries kept per build; maxLogLine the bytes of one.
const (
	maxBuildLogs = 10000
	maxLogLine   = 4096
	// MaxTemplateFiles bounds one uploaded COPY archive.
	MaxTemplateFiles = 8 << 30
)

// BuildStep is one step of a build spec.
type BuildStep struct {
	Type      string   `json:"type"`
	Args      []string `json:"args,omitempty"`
	FilesHash string   `json:"filesHash,omitempty"`
	Force     bool     `json:"force,omitempty"`
}

// BuildSpec is what POST /v2/templates/{id}/builds/{buildID} asks for.
type BuildSpec struct {
	FromImage    string      `json:"fromImage,omitempty"`
	FromTemplate string      `json:"fromTemplate,omitempty"`
	Force        bool        `json:"force,omitempty"`
	Steps        []BuildStep `json:"steps,omitempty"`
	StartCmd     string      `json:"startCmd,omitempty"`
	ReadyCmd     string      `json:"readyCmd,omitempty"`
	// FromRootfs names a root filesystem variant of the node's guest image
	// (ImageOptions.Rootfs builds it) to boot instead of an image: the
	// node's own templates (code-interpreter-v1). Not settable by the API.
	FromRootfs string `json:"fromRootfs,omitempty"`
	// ReadyTimeout, when longer than the node's, bounds the wait for
	// ReadyCmd (the node's own templates; not settable by the API).
	ReadyTimeout time.Duration `json:"readyTimeout,omitempty"`
	// RootCommands runs StartCmd and ReadyCmd as root instead of the
	// template's user: a daemon that must (the node's compose-v1 runs
	// dockerd). Not settable by the API.
	RootCommands bool `json:"rootCommands,omitempty"`
}

// BuildLog is one log entry of a build.
type BuildLog struct {
	Timestamp time.Time `json:"timestamp"`
	Level     string    `json:"level"` // debug, info, warn, error
	Message   string    `json:"message"`
	Step      string    `json:"step,omitempty"`
}

// BuildRecord is the persisted state of one build of a template.
type BuildRecord struct {
	ID         string     `json:"id"`
	Status     string     `json:"status"`
	Spec       *BuildSpec `json:"spec,omitempty"`
	Reason     string     `json:"reason,omitempty"`
	ReasonStep string     `json:"reasonStep,omitempty"`
	CreatedAt  time.Time  `json:"createdAt"`
	FinishedAt time.Time  `json:"finishedAt,omitzero"`
	PID        int        `json:"pid,omitempty"` // the build VM's, while it runs
}

// BuildStatus is a build's status with a window of its log entries.
type BuildStatus struct {
	TemplateID string
	BuildID    string
	Status     string
	Logs       []BuildLog
	Reason     string
	ReasonStep string
	// ReasonLogs are the last entries of the failing step.
	ReasonLogs []BuildLog
}

// ImageOptions configure builds (the [image] section plus the guest assets).
type ImageOptions struct {
	Pull oci.Options
	// RootfsSizeMiB sizes converted images (0: from the content).
	RootfsSizeMiB int
	// Agent is the aenv-agent binary injected into converted images.
	Agent string
	// Assets hold the kernel and initrd build VMs boot.
	Assets *image.Assets
	// Rootfs builds (or finds cached) the ext4 root filesystem of a named
	// variant of the guest image, for builds FromRootfs.
	Rootfs       func(ctx context.Context, variant string) (string, error)
	ReadyTimeout time.Duration
	StepTimeout  time.Duration
}

// Request is POST /v3/templates.
type Request struct {
	Name      string
	Tags      []string
	VCPUs     int
	MemoryMiB int
}

// Host is the node as builds see it: its committed templates, root disks
// and memory images.
type Host interface {
	// Committed returns a template that serves sandboxes, by id or name
	// (the node's default template included); errdefs.ErrNotFound if none.
	Committed(idOrName string) (*Template, error)
	// Publish makes a template whose build committed serve sandboxes.
	Publish(t *Template)
	// BuildDisk is a fresh writable root disk over the layers the image
	// config at imageConfig lists, for the build VM id with files in dir.
	BuildDisk(id, dir, imageConfig string) Disk
	// RestoreMemory returns the memory file a VM restored from the VMM
	// snapshot directory maps ("" for the snapshot's own).
	RestoreMemory(ctx context.Context, snapshotDir string) (string, error)
}

// Disk is a build VM's root disk.
type Disk interface {
	sandbox.Disk
	// Seal (VM stopped) commits what the VM wrote into a sealed layer,
	// releases the device and returns the image config listing the disk.
	Seal(ctx context.Context) (string, error)
}

// Config configures a Builder.
type Config struct {
	DataDir string
	Store   *store.Store
	// VMs bring build VMs up.
	VMs sandbox.Deps
	// VCPUs, MemoryMiB and DefaultUser are the node's defaults.
	VCPUs, MemoryMiB int
	DefaultUser      string
	Image            ImageOptions
	Logger           *slog.Logger
}

// Builder runs the node's template builds and keeps every template's
// record (also those waiting for or failing their build). Its worker
// goroutine runs one build at a time; Close stops it.
type Builder struct {
	cfg    Config
	host   Host
	log    *slog.Logger
	puller *oci.Puller
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex           // guards recs and logs, and orders record writes
	recs  map[string]*Template // every template (also waiting/failed ones), by id
	logs  map[string][]BuildLog
	queue chan buildJob
}

type buildJob struct{ templateID, buildID string }

// NewBuilder starts the build worker, loads every template in the store
// (built ones are published to serve sandboxes) and marks builds a previous
// run left unfinished as failed.
func NewBuilder(ctx context.Context, cfg Config, host Host) (*Builder, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Image.ReadyTimeout <= 0 {
		cfg.Image.ReadyTimeout = 5 * time.Minute
	}
	if cfg.Image.StepTimeout <= 0 {
		cfg.Image.StepTimeout = 30 * time.Minute
	}
	if cfg.Image.Pull.Log == nil {
		cfg.Image.Pull.Log = cfg.Logger
	}
	p, err := oci.NewPuller(cfg.Image.Pull)
	if err != nil {
		return nil, fmt.Errorf("template builder: %w", err)
	}
	bctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	b := &Builder{cfg: cfg, host: host, log: cfg.Logger.With("component", "template"), puller: p, ctx: bctx, cancel: cancel,
		recs: map[string]*Template{}, logs: map[string][]BuildLog{}, queue: make(chan buildJob, 1024)}
	if err := b.load(); err != nil {
		cancel()
		return nil, err
	}
	b.wg.Add(1)
	go b.worker()
	return b, nil
}

// load reads every template record, marking interrupted builds failed.
func (b *Builder) load() error {
	all, err := store.ListAll[Template](b.cfg.Store, store.Templates)
	if err != nil {
		return fmt.Errorf("template builder: load templates: %w", err)
	}
	for i := range all {
		t := &all[i]
		changed := false
		for _, br := range t.Builds {
			if br.Status == BuildBuilding {
				// Its VMM (its run dir is under the data directory) was
				// killed by the node's sweep of VMMs no record owns.
				br.Status, br.Reason, br.ReasonStep, br.FinishedAt, br.PID = BuildError, "interrupted by node restart", StepBase, time.Now().UTC(), 0
				changed = true
				b.appendLogFile(t.ID, br.ID, BuildLog{Timestamp: br.FinishedAt, Level: "error", Message: br.Reason})
			}
		}
		if changed && (t.Snapshot == "" || t.BuildID == "") {
			t.Status = BuildError // no earlier build serves sandboxes
		}
		if changed {
			if err := b.cfg.Store.Put(store.Templates, t.ID, t); err != nil {
				return fmt.Errorf("template builder: record template %s: %w", t.ID, err)
			}
		}
		b.recs[t.ID] = t
		if t.Ready() && t.Snapshot != "" {
			b.host.Publish(t.Clone())
		}
	}
	b.sweepUnrecorded() // adopt.go
	return nil
}

// Close cancels a running build and waits for the worker to stop (its VM
// is stopped; the build is left for the next start to mark failed).
func (b *Builder) Close() {
	b.cancel()
	b.wg.Wait()
}

// resolve finds a template by id or name; b.mu must be held.
func (b *Builder) resolve(idOrName string) *Template {
	if t, ok := b.recs[idOrName]; ok {
		return t
	}
	for _, t := range b.recs {
		if slices.Contains(t.Names, idOrName) {
			return t
		}
	}
	return nil
}

// Resolve returns a copy of any template the builder knows (also one not
// built yet) by id or name.
func (b *Builder) Resolve(idOrName string) (Template, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.resolve(idOrName)
	if t == nil {
		return Template{}, false
	}
	return *t.Clone(), true
}

// All returns copies of every template record.
func (b *Builder) All() []Template {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := make([]Template, 0, len(b.recs))
	for _, t := range b.recs {
		out = append(out, *t.Clone())
	}
	return out
}

// Create registers a template (or, when name already names one, a new
// build of it) and returns it with the new build waiting for its spec.
func (b *Builder) Create(req Request) (Template, string, error) {
	if req.Name != "" && !snapshot.ValidName.MatchString(req.Name) {
		return Template{}, "", fmt.Errorf("template name %q: want letters, digits, '.', '_' or '-' (at most 128): %w", req.Name, errdefs.ErrInvalid)
	}
	if req.VCPUs == 0 {
		req.VCPUs = b.cfg.VCPUs
	}
	if req.MemoryMiB == 0 {
		req.MemoryMiB = b.cfg.MemoryMiB
	}
	if req.VCPUs < 1 || req.VCPUs > 64 || req.MemoryMiB < 128 || req.MemoryMiB > 1<<20 {
		return Template{}, "", fmt.Errorf("template resources: cpuCount 1..64 and memoryMB >= 128 (got %d, %d): %w", req.VCPUs, req.MemoryMiB, errdefs.ErrInvalid)
	}
	buildID, err := ids.UUID()
	if err != nil {
		return Template{}, "", err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	t, err := b.createTarget(req.Name)
	if err != nil {
		return Template{}, "", err
	}
	now := time.Now().UTC()
	t.Tags = req.Tags
	t.VCPUs, t.MemoryMiB = req.VCPUs, req.MemoryMiB
	t.Builds[buildID] = &BuildRecord{ID: buildID, Status: BuildWaiting, CreatedAt: now}
	t.LatestBuild, t.UpdatedAt = buildID, now
	if !t.Ready() || t.Snapshot == "" {
		t.Status = BuildWaiting
	}
	if err := b.cfg.Store.Put(store.Templates, t.ID, t); err != nil {
		return Template{}, "", fmt.Errorf("record template %s: %w", t.ID, err)
	}
	b.recs[t.ID] = t
	return *t.Clone(), buildID, nil
}

// createTarget returns a copy of the template name names, or a new one;
// b.mu held.
func (b *Builder) createTarget(name string) (*Template, error) {
	var t *Template
	if name != "" {
		t = b.resolve(name)
		if t != nil && t.ID == DefaultID {
			return nil, fmt.Errorf("template %q is the node's default template: %w", name, errdefs.ErrConflict)
		}
	}
	if t == nil {
		id, err := ids.New()
		if err != nil {
			return nil, err
		}
		t = &Template{ID: id, Dir: filepath.Join(b.cfg.DataDir, "templates", id), EnvdVersion: AgentVersion,
			CreatedAt: time.Now().UTC(), Status: BuildWaiting}
		if name != "" {
			t.Names = []string{name}
		}
	} else {
		t = t.Clone()
	}
	if t.Builds == nil {
		t.Builds = map[string]*BuildRecord{}
	}
	for _, br := range t.Builds {
		if br.Status == BuildBuilding {
			return nil, fmt.Errorf("template %s has build %s running: %w", t.ID, br.ID, errdefs.ErrConflict)
		}
	}
	return t, nil
}

// Start queues the build of a waiting build with spec.
func (b *Builder) Start(templateID, buildID string, spec BuildSpec) error {
	if err := b.validateSpec(templateID, spec); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.recs[templateID]
	if !ok {
		return fmt.Errorf("template %q: %w", templateID, errdefs.ErrNotFound)
	}
	br, ok := t.Builds[buildID]
	if !ok {
		return fmt.Errorf("build %q of template %s: %w", buildID, templateID, errdefs.ErrNotFound)
	}
	if br.Status != BuildWaiting {
		return fmt.Errorf("build %s is %s, not waiting: %w", buildID, br.Status, errdefs.ErrConflict)
	}
	if err := b.checkSource(templateID, spec); err != nil {
		return err
	}
	nt := t.Clone()
	nbr := nt.Builds[buildID]
	nbr.Status, nbr.Spec = BuildBuilding, &spec
	if !nt.Ready() || nt.Snapshot == "" {
		nt.Status = BuildBuilding
	}
	nt.UpdatedAt = time.Now().UTC()
	if err := b.cfg.Store.Put(store.Templates, nt.ID, nt); err != nil {
		return fmt.Errorf("record template %s: %w", nt.ID, err)
	}
	b.recs[nt.ID] = nt
	ahead := len(b.queue) // before the send: the worker may take the job at once
	select {
	case b.queue <- buildJob{templateID, buildID}:
	default:
		return fmt.Errorf("build queue is full: %w", errdefs.ErrConflict)
	}
	b.logLocked(templateID, buildID, "info", StepBase, fmt.Sprintf("build queued (%d ahead)", ahead))
	return nil
}

// validateSpec checks what a spec says on its own.
func (b *Builder) validateSpec(templateID string, spec BuildSpec) error {
	sources := 0
	for _, src := range []string{spec.FromImage, spec.FromTemplate, spec.FromRootfs} {
		if src != "" {
			sources++
		}
	}
	if sources != 1 {
		return fmt.Errorf("build spec: exactly one of fromImage and fromTemplate is required: %w", errdefs.ErrInvalid)
	}
	if err := validateSteps(spec.Steps); err != nil {
		return err
	}
	if spec.FromImage != "" {
		if _, err := b.puller.ParseReference(spec.FromImage); err != nil {
			return fmt.Errorf("fromImage: %w: %w", err, errdefs.ErrInvalid)
		}
	}
	for _, st := range spec.Steps {
		if st.FilesHash != "" {
			if _, err := os.Stat(b.filesPath(st.FilesHash)); err != nil {
				return fmt.Errorf("step %s: files %s were not uploaded (PUT /templates/%s/files/%s): %w", st.Type, st.FilesHash, templateID, st.FilesHash, errdefs.ErrInvalid)
			}
		}
	}
	return nil
}

// checkSource checks a fromTemplate names a ready template other than the
// one being built; b.mu held.
func (b *Builder) checkSource(templateID string, spec BuildSpec) error {
	if spec.FromTemplate == "" {
		return nil
	}
	src := b.resolve(spec.FromTemplate)
	if src == nil && spec.FromTemplate == DefaultID {
		if d, err := b.host.Committed(DefaultID); err == nil {
			src = d
		}
	}
	if src == nil || !src.Ready() || src.Snapshot == "" {
		return fmt.Errorf("fromTemplate %q: no ready template by that id or name: %w", spec.FromTemplate, errdefs.ErrInvalid)
	}
	if src.ID == templateID {
		return fmt.Errorf("fromTemplate %q is the template being built: %w", spec.FromTemplate, errdefs.ErrInvalid)
	}
	return nil
}

var stepTypes = []string{"RUN", "ENV", "ARG", "WORKDIR", "USER", "COPY", "ADD"}

func validateSteps(steps []BuildStep) error {
	for i, st := range steps {
		typ := strings.ToUpper(st.Type)
		if !slices.Contains(stepTypes, typ) {
			return fmt.Errorf("step %d: unsupported type %q (want one of %v): %w", i+1, st.Type, stepTypes, errdefs.ErrInvalid)
		}
		need := map[string]int{"RUN": 1, "ENV": 2, "ARG": 1, "WORKDIR": 1, "USER": 1, "COPY": 2, "ADD": 2}[typ]
		if len(st.Args) < need {
			return fmt.Errorf("step %d %s: needs at least %d args, got %d: %w", i+1, typ, need, len(st.Args), errdefs.ErrInvalid)
		}
		if typ == "ENV" && len(st.Args)%2 != 0 {
			return fmt.Errorf("step %d ENV: args are key, value pairs: %w", i+1, errdefs.ErrInvalid)
		}
		if (typ == "COPY" || typ == "ADD") && !validHash(st.FilesHash) {
			return fmt.Errorf("step %d %s: filesHash must be 64 lowercase hex characters: %w", i+1, typ, errdefs.ErrInvalid)
		}
	}
	return nil
}

func levelRank(l string) int {
	switch l {
	case "info":
		return 1
	case "warn":
		return 2
	case "error":
		return 3
	}
	return 0
}

// Status returns a build's status and its log entries at level or above
// (all when level is empty), from offset on, at most limit (all when limit
// is negative).
func (b *Builder) Status(templateID, buildID string, offset, limit int, level string) (BuildStatus, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.recs[templateID]
	if t == nil {
		return BuildStatus{}, fmt.Errorf("template %q: %w", templateID, errdefs.ErrNotFound)
	}
	br := t.Builds[buildID]
	if br == nil {
		return BuildStatus{}, fmt.Errorf("build %q of template %s: %w", buildID, templateID, errdefs.ErrNotFound)
	}
	all := b.logsLocked(templateID, buildID)
	min := levelRank(level)
	var sel []BuildLog
	for _, l := range all {
		if levelRank(l.Level) >= min {
			sel = append(sel, l)
		}
	}
	st := BuildStatus{TemplateID: templateID, BuildID: buildID, Status: br.Status, Reason: br.Reason, ReasonStep: br.ReasonStep}
	if offset < len(sel) {
		sel = sel[offset:]
		if limit >= 0 && len(sel) > limit {
			sel = sel[:limit]
		}
		st.Logs = sel
	}
	if br.Status == BuildError {
		st.ReasonLogs = reasonLogs(all, br.ReasonStep)
	}
	return st, nil
}

// reasonLogs returns the last entries of the failing step.
func reasonLogs(all []BuildLog, step string) []BuildLog {
	var out []BuildLog
	for _, l := range all {
		if step != "" && l.Step == step {
			out = append(out, l)
		}
	}
	if len(out) > 50 {
		out = out[len(out)-50:]
	}
	return out
}

// Delete removes a template's record and files. inUse, called with the
// template while no build can start, vetoes the deletion (a sandbox or
// snapshot uses it). Refused (ErrConflict) for the default template, while
// the template builds, and while another template was built from it.
func (b *Builder) Delete(idOrName string, inUse func(t *Template) error) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.resolve(idOrName)
	if t == nil {
		return fmt.Errorf("template %q: %w", idOrName, errdefs.ErrNotFound)
	}
	if t.ID == DefaultID {
		return fmt.Errorf("template %s is the node's default template: %w", t.ID, errdefs.ErrConflict)
	}
	for _, br := range t.Builds {
		if br.Status == BuildBuilding {
			return fmt.Errorf("template %s: build %s is running: %w", t.ID, br.ID, errdefs.ErrConflict)
		}
	}
	for _, other := range b.recs {
		if other.ID != t.ID && other.Parent == t.ID {
			return fmt.Errorf("template %s: template %s was built from it: %w", t.ID, other.ID, errdefs.ErrConflict)
		}
	}
	if err := inUse(t); err != nil {
		return err
	}
	if err := b.cfg.Store.Delete(store.Templates, t.ID); err != nil {
		return fmt.Errorf("delete template %s: %w", t.ID, err)
	}
	delete(b.recs, t.ID)
	for id := range t.Builds {
		delete(b.logs, id)
	}
	if err := os.RemoveAll(filepath.Join(b.cfg.DataDir, "templates", t.ID)); err != nil {
		b.log.Warn("remove template files", "template", t.ID, "err", err)
	}
	b.log.Info("template deleted", "template", t.ID)
	return nil
}
