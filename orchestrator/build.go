package orchestrator

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
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentenv/agentenv/guest/image"
	"github.com/agentenv/agentenv/internal/ids"
	"github.com/agentenv/agentenv/oci"
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
	Assets       *image.Assets
	ReadyTimeout time.Duration
	StepTimeout  time.Duration
}

// TemplateRequest is POST /v3/templates.
type TemplateRequest struct {
	Name      string
	Tags      []string
	VCPUs     int
	MemoryMiB int
}

type builder struct {
	o      *Orchestrator
	opt    ImageOptions
	puller *oci.Puller
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	recs  map[string]*Template // every template (also waiting/failed ones), by id
	logs  map[string][]BuildLog
	queue chan buildJob
}

type buildJob struct{ templateID, buildID string }

// builders holds each orchestrator's builder. It lives outside the
// Orchestrator struct so builds stay out of orchestrator.go.
var builders sync.Map // *Orchestrator -> *builder

func (o *Orchestrator) builder() (*builder, error) {
	if b, ok := builders.Load(o); ok {
		return b.(*builder), nil
	}
	return nil, fmt.Errorf("template builds are not enabled on this node: %w", ErrInvalid)
}

var validName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,127}$`)

// EnableBuilds starts the build worker, loads every template in the store
// (built ones become usable for sandboxes) and marks builds a previous run
// left unfinished as failed.
func (o *Orchestrator) EnableBuilds(ctx context.Context, opt ImageOptions) error {
	if opt.ReadyTimeout <= 0 {
		opt.ReadyTimeout = 5 * time.Minute
	}
	if opt.StepTimeout <= 0 {
		opt.StepTimeout = 30 * time.Minute
	}
	if opt.Pull.Log == nil {
		opt.Pull.Log = o.log
	}
	p, err := oci.NewPuller(opt.Pull)
	if err != nil {
		return fmt.Errorf("enable builds: %w", err)
	}
	bctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	b := &builder{o: o, opt: opt, puller: p, ctx: bctx, cancel: cancel,
		recs: map[string]*Template{}, logs: map[string][]BuildLog{}, queue: make(chan buildJob, 1024)}
	all, err := store.ListAll[Template](o.store, store.Templates)
	if err != nil {
		cancel()
		return fmt.Errorf("enable builds: load templates: %w", err)
	}
	for i := range all {
		t := &all[i]
		changed := false
		for _, br := range t.Builds {
			if br.Status == BuildBuilding {
				// Its VMM (its run dir is under the data directory) was
				// killed by Recover's sweep of VMMs no record owns.
				br.Status, br.Reason, br.ReasonStep, br.FinishedAt, br.PID = BuildError, "interrupted by node restart", StepBase, time.Now().UTC(), 0
				changed = true
				b.appendLogFile(t.ID, br.ID, BuildLog{Timestamp: br.FinishedAt, Level: "error", Message: br.Reason})
			}
		}
		if changed && (t.Snapshot == "" || t.BuildID == "") {
			t.Status = BuildError // no earlier build serves sandboxes
		}
		if changed {
			if err := o.store.Put(store.Templates, t.ID, t); err != nil {
				cancel()
				return fmt.Errorf("enable builds: %w", err)
			}
		}
		b.recs[t.ID] = t
		if t.ready() && t.Snapshot != "" {
			o.setTemplate(t.clone())
		}
	}
	builders.Store(o, b)
	b.wg.Add(1)
	go b.worker()
	return nil
}

// CloseBuilds cancels a running build and waits for the worker to stop
// (its VM is stopped; the build is left for the next start to mark failed);
// build calls fail afterwards.
func (o *Orchestrator) CloseBuilds() {
	b, err := o.builder()
	if err != nil {
		return
	}
	b.cancel()
	b.wg.Wait()
	builders.Delete(o)
}

func (t *Template) ready() bool { return t.Status == "" || t.Status == BuildReady }

func (t *Template) clone() *Template {
	c := *t
	c.Names = slices.Clone(t.Names)
	c.Tags = slices.Clone(t.Tags)
	c.Builds = make(map[string]*BuildRecord, len(t.Builds))
	for k, v := range t.Builds {
		bv := *v
		c.Builds[k] = &bv
	}
	return &c
}

// resolve finds a template by id or name; b.mu must be held.
func (b *builder) resolve(idOrName string) *Template {
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

// templateByName finds a committed template by one of its names; o.mu must
// be held.
func (o *Orchestrator) templateByName(name string) (*Template, bool) {
	for _, t := range o.templates {
		if slices.Contains(t.Names, name) {
			return t, true
		}
	}
	return nil, false
}

// CreateTemplate registers a template (or, when name already names one, a
// new build of it) and returns it with the new build waiting for its spec.
func (o *Orchestrator) CreateTemplate(req TemplateRequest) (Template, string, error) {
	b, err := o.builder()
	if err != nil {
		return Template{}, "", err
	}
	if req.Name != "" && !validName.MatchString(req.Name) {
		return Template{}, "", fmt.Errorf("template name %q: want letters, digits, '.', '_' or '-' (at most 128): %w", req.Name, ErrInvalid)
	}
	if req.VCPUs == 0 {
		req.VCPUs = o.cfg.VCPUs
	}
	if req.MemoryMiB == 0 {
		req.MemoryMiB = o.cfg.MemoryMiB
	}
	if req.VCPUs < 1 || req.VCPUs > 64 || req.MemoryMiB < 128 || req.MemoryMiB > 1<<20 {
		return Template{}, "", fmt.Errorf("template resources: cpuCount 1..64 and memoryMB >= 128 (got %d, %d): %w", req.VCPUs, req.MemoryMiB, ErrInvalid)
	}
	buildID, err := ids.UUID()
	if err != nil {
		return Template{}, "", err
	}
	now := time.Now().UTC()
	b.mu.Lock()
	defer b.mu.Unlock()
	var t *Template
	if req.Name != "" {
		t = b.resolve(req.Name)
		if t != nil && t.ID == DefaultTemplate {
			return Template{}, "", fmt.Errorf("template %q is the node's default template: %w", req.Name, ErrConflict)
		}
	}
	if t == nil {
		id, err := ids.New()
		if err != nil {
			return Template{}, "", err
		}
		t = &Template{ID: id, Dir: filepath.Join(o.cfg.DataDir, "templates", id), EnvdVersion: envdVersion, CreatedAt: now,
			Status: BuildWaiting}
		if req.Name != "" {
			t.Names = []string{req.Name}
		}
	} else {
		t = t.clone()
	}
	if t.Builds == nil {
		t.Builds = map[string]*BuildRecord{}
	}
	for _, br := range t.Builds {
		if br.Status == BuildBuilding {
			return Template{}, "", fmt.Errorf("template %s has build %s running: %w", t.ID, br.ID, ErrConflict)
		}
	}
	t.Tags = req.Tags
	t.VCPUs, t.MemoryMiB = req.VCPUs, req.MemoryMiB
	t.Builds[buildID] = &BuildRecord{ID: buildID, Status: BuildWaiting, CreatedAt: now}
	t.LatestBuild, t.UpdatedAt = buildID, now
	if !t.ready() || t.Snapshot == "" {
		t.Status = BuildWaiting
	}
	if err := o.store.Put(store.Templates, t.ID, t); err != nil {
		return Template{}, "", err
	}
	b.recs[t.ID] = t
	return *t.clone(), buildID, nil
}

// StartBuild queues the build of a waiting build with spec.
func (o *Orchestrator) StartBuild(templateID, buildID string, spec BuildSpec) error {
	b, err := o.builder()
	if err != nil {
		return err
	}
	if o.sd == nil {
		return fmt.Errorf("template builds need the storaged storage backend: %w", ErrInvalid)
	}
	if (spec.FromImage == "") == (spec.FromTemplate == "") {
		return fmt.Errorf("build spec: exactly one of fromImage and fromTemplate is required: %w", ErrInvalid)
	}
	if err := validateSteps(spec.Steps); err != nil {
		return err
	}
	if spec.FromImage != "" {
		if _, err := b.puller.ParseReference(spec.FromImage); err != nil {
			return fmt.Errorf("fromImage: %w: %w", err, ErrInvalid)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.recs[templateID]
	if !ok {
		return fmt.Errorf("template %q: %w", templateID, ErrNotFound)
	}
	br, ok := t.Builds[buildID]
	if !ok {
		return fmt.Errorf("build %q of template %s: %w", buildID, templateID, ErrNotFound)
	}
	if br.Status != BuildWaiting {
		return fmt.Errorf("build %s is %s, not waiting: %w", buildID, br.Status, ErrConflict)
	}
	if spec.FromTemplate != "" {
		src := b.resolve(spec.FromTemplate)
		if src == nil && spec.FromTemplate == DefaultTemplate {
			if d, err := o.Template(DefaultTemplate); err == nil {
				src = d
			}
		}
		if src == nil || !src.ready() || src.Snapshot == "" {
			return fmt.Errorf("fromTemplate %q: no ready template by that id or name: %w", spec.FromTemplate, ErrInvalid)
		}
		if src.ID == templateID {
			return fmt.Errorf("fromTemplate %q is the template being built: %w", spec.FromTemplate, ErrInvalid)
		}
	}
	for _, st := range spec.Steps {
		if st.FilesHash != "" {
			if _, err := os.Stat(o.filesPath(st.FilesHash)); err != nil {
				return fmt.Errorf("step %s: files %s were not uploaded (PUT /templates/%s/files/%s): %w", st.Type, st.FilesHash, templateID, st.FilesHash, ErrInvalid)
			}
		}
	}
	nt := t.clone()
	nbr := nt.Builds[buildID]
	nbr.Status, nbr.Spec = BuildBuilding, &spec
	if !nt.ready() || nt.Snapshot == "" {
		nt.Status = BuildBuilding
	}
	nt.UpdatedAt = time.Now().UTC()
	if err := o.store.Put(store.Templates, nt.ID, nt); err != nil {
		return err
	}
	b.recs[nt.ID] = nt
	select {
	case b.queue <- buildJob{templateID, buildID}:
	default:
		return fmt.Errorf("build queue is full: %w", ErrConflict)
	}
	b.logLocked(templateID, buildID, "info", StepBase, fmt.Sprintf("build queued (%d ahead)", len(b.queue)-1))
	return nil
}

var stepTypes = []string{"RUN", "ENV", "ARG", "WORKDIR", "USER", "COPY", "ADD"}

func validateSteps(steps []BuildStep) error {
	for i, st := range steps {
		typ := strings.ToUpper(st.Type)
		if !slices.Contains(stepTypes, typ) {
			return fmt.Errorf("step %d: unsupported type %q (want one of %v): %w", i+1, st.Type, stepTypes, ErrInvalid)
		}
		need := map[string]int{"RUN": 1, "ENV": 2, "ARG": 1, "WORKDIR": 1, "USER": 1, "COPY": 2, "ADD": 2}[typ]
		if len(st.Args) < need {
			return fmt.Errorf("step %d %s: needs at least %d args, got %d: %w", i+1, typ, need, len(st.Args), ErrInvalid)
		}
		if typ == "ENV" && len(st.Args)%2 != 0 {
			return fmt.Errorf("step %d ENV: args are key, value pairs: %w", i+1, ErrInvalid)
		}
		if (typ == "COPY" || typ == "ADD") && !validHash(st.FilesHash) {
			return fmt.Errorf("step %d %s: filesHash must be 64 lowercase hex characters: %w", i+1, typ, ErrInvalid)
		}
	}
	return nil
}

// BuildStatusOf returns a build's status and its log entries at level or
// above (all when level is empty), from offset on, at most limit (all when
// limit is negative).
func (o *Orchestrator) BuildStatusOf(templateID, buildID string, offset, limit int, level string) (BuildStatus, error) {
	b, err := o.builder()
	if err != nil {
		return BuildStatus{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	t := b.recs[templateID]
	if t == nil {
		return BuildStatus{}, fmt.Errorf("template %q: %w", templateID, ErrNotFound)
	}
	br := t.Builds[buildID]
	if br == nil {
		return BuildStatus{}, fmt.Errorf("build %q of template %s: %w", buildID, templateID, ErrNotFound)
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
		for _, l := range all {
			if br.ReasonStep != "" && l.Step == br.ReasonStep {
				st.ReasonLogs = append(st.ReasonLogs, l)
			}
		}
		if len(st.ReasonLogs) > 50 {
			st.ReasonLogs = st.ReasonLogs[len(st.ReasonLogs)-50:]
		}
	}
	return st, nil
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

// defaultUser is the user a sandbox's commands run as: its template's final
// USER, else the node's default.
func (o *Orchestrator) defaultUser(templateID string) string {
	// A snapshot's sandboxes keep the user of the template it descends from.
	for range 64 {
		o.mu.Lock()
		t, ok := o.templates[templateID]
		o.mu.Unlock()
		if ok {
			if t.DefaultUser != "" {
				return t.DefaultUser
			}
			break
		}
		var snap snapshot.Record
		if err := o.store.Get(store.Snapshots, templateID, &snap); err != nil || snap.TemplateID == templateID {
			break
		}
		templateID = snap.TemplateID
	}
	return o.cfg.DefaultUser
}
