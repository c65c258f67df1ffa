package api

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentenv/agentenv/api/eventlog"
	"github.com/agentenv/agentenv/api/metricsring"
	"github.com/agentenv/agentenv/api/webhooks"
	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/orchestrator"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot/repo/upload"
	"github.com/agentenv/agentenv/store"
	"github.com/go-chi/chi/v5"
)

// maxBody bounds request bodies so hostile clients cannot exhaust memory.
const maxBody = 1 << 20

// clientID is E2B's deprecated field; any constant will do.
const clientID = "aenvd"

// Options configure the API handler.
type Options struct {
	Orchestrator *orchestrator.Orchestrator
	APIKey       string
	Domain       string
	// DefaultTimeout applies to creates without a timeout; MaxTimeout caps any.
	DefaultTimeout, MaxTimeout time.Duration
	// Proxy, when set, receives every request that names a sandbox
	// (E2b-Sandbox-Id header or {port}-{id}.{domain} host).
	Proxy interface {
		http.Handler
		Match(r *http.Request) bool
	}
	// Node identifies this node in /nodes.
	Node NodeInfo
	// Metrics serves GET /metrics (Prometheus); nil answers 404.
	Metrics http.Handler
	// MetricsHistory answers the sandbox metrics routes by range; nil
	// answers one sample taken now.
	MetricsHistory *metricsring.History
	// Webhooks holds the lifecycle webhooks; nil answers their routes 404.
	Webhooks *webhooks.Dispatcher
	// Events is the node's recent sandbox lifecycle events (subscribed to
	// the orchestrator by the caller); nil answers /events/sandboxes 404.
	Events *eventlog.Log
	// Store keeps the API's own records (template attributes); nil keeps
	// them in memory.
	Store *store.Store
	// StateDir is the node's state directory, where its status (draining
	// or ready) is kept across restarts; empty keeps it in memory.
	StateDir string
	// Repository reports the snapshots' commits to the snapshot
	// repository (replica.Replica); nil when the node has none.
	Repository RepositoryStatus
	// Compose starts the projects of POST /sandboxes-compose
	// (composeup.Starter); nil answers a valid file 501.
	Compose ComposeStarter
	Logger  *slog.Logger
}

// RepositoryStatus is where a snapshot's commit to the repository is.
type RepositoryStatus interface {
	SnapshotStatus(id string) (upload.Status, bool)
}

// Server implements ServerInterface over the orchestrator.
type Server struct {
	o    *orchestrator.Orchestrator
	opts Options
	log  *slog.Logger

	draining atomic.Bool // POST /nodes/{id} {status: draining}
	statusMu sync.Mutex  // orders status changes: the file and draining agree
	attrs    attrStore   // templates' public flag (templateattrs.go)
}

// NewHandler returns the complete HTTP handler: sandbox proxy, health,
// extra routes and the authenticated control API.
func NewHandler(opts Options) http.Handler {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	s := &Server{o: opts.Orchestrator, opts: opts, log: opts.Logger.With("component", "api"), attrs: attrStore{st: opts.Store}}
	s.initDraining()
	router := chi.NewRouter()
	router.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no route "+r.URL.Path)
	})
	router.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusMethodNotAllowed, "method "+r.Method+" not allowed on "+r.URL.Path)
	})
	apiHandler := HandlerWithOptions(s, ChiServerOptions{
		BaseRouter:  router,
		Middlewares: []MiddlewareFunc{s.auth},
		ErrorHandlerFunc: func(w http.ResponseWriter, r *http.Request, err error) {
			writeError(w, http.StatusBadRequest, err.Error())
		},
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil && v != http.ErrAbortHandler {
				s.log.Error("handler panic", "path", r.URL.Path, "panic", v)
				writeError(w, http.StatusInternalServerError, "internal error")
			}
		}()
		if opts.Proxy != nil && opts.Proxy.Match(r) {
			opts.Proxy.ServeHTTP(w, r)
			return
		}
		apiHandler.ServeHTTP(w, r)
	})
}

// auth checks X-API-Key on every route but /health and /metrics (scraped
// by Prometheus; read-only counters) and a template files upload that
// carries its upload token (uploadtoken.go).
func (s *Server) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" || r.URL.Path == "/metrics" {
			next.ServeHTTP(w, r)
			return
		}
		if uploadAuthorized(r, s.opts.APIKey) {
			next.ServeHTTP(w, r)
			return
		}
		key := r.Header.Get("X-API-Key")
		if key == "" || subtle.ConstantTimeCompare([]byte(key), []byte(s.opts.APIKey)) != 1 {
			writeError(w, http.StatusUnauthorized, "invalid or missing X-API-Key")
			return
		}
		next.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, wire.Error{Code: int32(status), Message: msg})
}

// fail maps orchestrator errors to statuses.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	status := statusOf(err)
	if status >= 500 {
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	if status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", retryAfter(err))
	}
	writeError(w, status, err.Error())
}

// statusOf maps an orchestrator error to an HTTP status.
func statusOf(err error) int {
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, orchestrator.ErrNotFound):
		status = http.StatusNotFound
	case errors.Is(err, orchestrator.ErrConflict):
		status = http.StatusConflict
	case errors.Is(err, orchestrator.ErrInvalid):
		status = http.StatusBadRequest
	case errors.Is(err, orchestrator.ErrCapacity):
		status = http.StatusServiceUnavailable
	case errors.Is(err, orchestrator.ErrLimit):
		status = http.StatusTooManyRequests
	case errors.Is(err, context.Canceled):
		status = 499
	}
	return status
}

// retryAfter is the Retry-After (whole seconds) of a refusal: what the
// error asks for (admission.Refusal), else 5.
func retryAfter(err error) string {
	var r interface{ RetryAfter() time.Duration }
	if errors.As(err, &r) && r.RetryAfter() > 0 {
		return strconv.Itoa(int(math.Ceil(r.RetryAfter().Seconds())))
	}
	return "5"
}

// decode reads an optional (required=false) or mandatory JSON body into v.
func decode(w http.ResponseWriter, r *http.Request, v any, required bool) bool {
	return decodeLimit(w, r, v, required, maxBody)
}

// decodeLimit is decode for a body of at most limit bytes.
func decodeLimit(w http.ResponseWriter, r *http.Request, v any, required bool, limit int64) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		writeError(w, http.StatusBadRequest, "read body: "+err.Error())
		return false
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		if required {
			writeError(w, http.StatusBadRequest, "request body is required")
			return false
		}
		return true
	}
	if err := json.Unmarshal(body, v); err != nil {
		writeError(w, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return false
	}
	return true
}

// GetHealth implements ServerInterface.
func (s *Server) GetHealth(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusNoContent)
}

// GetMetrics implements ServerInterface.
func (s *Server) GetMetrics(w http.ResponseWriter, r *http.Request) {
	if s.opts.Metrics == nil {
		writeError(w, http.StatusNotFound, "metrics are not enabled")
		return
	}
	s.opts.Metrics.ServeHTTP(w, r)
}

// CreateSandbox implements ServerInterface (SDK <= 2.50: secure is opt-in).
func (s *Server) CreateSandbox(w http.ResponseWriter, r *http.Request) { s.create(w, r, false) }

// CreateSandboxV2 implements ServerInterface (SDK 2.51: always secured).
func (s *Server) CreateSandboxV2(w http.ResponseWriter, r *http.Request) { s.create(w, r, true) }

func (s *Server) create(w http.ResponseWriter, r *http.Request, v2 bool) {
	if s.refuseWhileDraining(w) {
		return
	}
	var req wire.NewSandbox
	if !decode(w, r, &req, true) {
		return
	}
	if req.TemplateID == "" {
		writeError(w, http.StatusBadRequest, "templateID is required")
		return
	}
	timeout, ok := s.createTimeout(w, req.Timeout, v2)
	if !ok {
		return
	}
	opts := orchestrator.CreateOptions{
		TemplateID: req.TemplateID, Timeout: timeout, Secure: v2 || deref(req.Secure),
		AutoPause: deref(req.AutoPause), Metadata: derefMap(req.Metadata), EnvVars: derefMap(req.EnvVars),
		Policy: createPolicy(req), Drives: createDrives(req.Drives), Volumes: createVolumes(req.VolumeMounts),
	}
	if req.Network != nil && req.Network.AllowPublicTraffic != nil {
		opts.PrivateTraffic = !*req.Network.AllowPublicTraffic
	}
	if req.Network != nil && req.Network.MaskRequestHost != nil {
		if !validHostMask(*req.Network.MaskRequestHost) {
			writeError(w, http.StatusBadRequest, "network.maskRequestHost must be a host name (with an optional ${PORT})")
			return
		}
		opts.MaskRequestHost = *req.Network.MaskRequestHost
	}
	if req.AutoResume != nil {
		opts.AutoResume = deref(req.AutoResume.Enabled)
	}
	if opts.AutoPause && req.AutoPauseMemory != nil && !*req.AutoPauseMemory {
		if opts.AutoResume {
			writeError(w, http.StatusBadRequest, "autoResume cannot be combined with autoPauseMemory false: a sandbox paused without memory must be resumed explicitly (connect)")
			return
		}
		opts.AutoPauseFilesystemOnly = true
	}
	rec, err := s.o.Create(r.Context(), opts)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.sandbox(rec))
}

// v2DefaultTimeout is the timeout of POST /v2/sandboxes without one.
const v2DefaultTimeout = 300 * time.Second

// createTimeout is a create's timeout: the request's, or the default of its
// API version (v2's documented 300 s; v1 the configured default).
func (s *Server) createTimeout(w http.ResponseWriter, secs *int32, v2 bool) (time.Duration, bool) {
	if v2 && (secs == nil || *secs == 0) {
		return min(v2DefaultTimeout, s.opts.MaxTimeout), true
	}
	return s.timeout(w, secs)
}

// timeout converts a request's seconds into a duration within limits.
func (s *Server) timeout(w http.ResponseWriter, secs *int32) (time.Duration, bool) {
	if secs == nil || *secs == 0 {
		return s.opts.DefaultTimeout, true
	}
	if *secs < 0 {
		writeError(w, http.StatusBadRequest, "timeout must not be negative")
		return 0, false
	}
	d := time.Duration(*secs) * time.Second
	if d > s.opts.MaxTimeout {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("timeout %s exceeds the maximum %s", d, s.opts.MaxTimeout))
		return 0, false
	}
	return d, true
}

func (s *Server) sandbox(rec sandbox.Record) wire.Sandbox {
	out := wire.Sandbox{SandboxID: rec.ID, TemplateID: rec.TemplateID, ClientID: clientID, EnvdVersion: rec.EnvdVersion, Alias: ptr(rec.TemplateID)}
	if rec.Secure && rec.AccessToken != "" { // a non-secure sandbox's token stays between proxy and agent
		out.EnvdAccessToken = ptr(rec.AccessToken)
	}
	if rec.TrafficToken != "" {
		out.TrafficAccessToken = ptr(rec.TrafficToken)
	}
	if s.opts.Domain != "" {
		out.Domain = ptr(s.opts.Domain)
	}
	return out
}

func listedState(st sandbox.State) wire.SandboxState {
	if st == sandbox.Paused || st == sandbox.Resuming {
		return wire.Paused
	}
	return wire.Running
}

func listed(rec sandbox.Record) wire.ListedSandbox {
	return wire.ListedSandbox{
		SandboxID: rec.ID, TemplateID: rec.TemplateID, Alias: ptr(rec.TemplateID), ClientID: clientID,
		StartedAt: rec.StartedAt, EndAt: rec.EndAt, CpuCount: int32(rec.VCPUs), MemoryMB: int32(rec.MemoryMiB),
		DiskSizeMB: int32(rec.DiskMiB), Metadata: ptr(nonNil(rec.Metadata)), State: listedState(rec.State),
		EnvdVersion: rec.EnvdVersion, VolumeMounts: volumeMounts(rec.Drives),
	}
}

// GetSandbox implements ServerInterface.
func (s *Server) GetSandbox(w http.ResponseWriter, r *http.Request, sandboxID wire.SandboxID) {
	rec, err := s.o.Get(sandboxID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	onTimeout := wire.Kill
	if rec.AutoPause {
		onTimeout = wire.Pause
	}
	l := listed(rec)
	d := wire.SandboxDetail{
		SandboxID: l.SandboxID, TemplateID: l.TemplateID, Alias: l.Alias, ClientID: l.ClientID, StartedAt: l.StartedAt,
		EndAt: l.EndAt, CpuCount: l.CpuCount, MemoryMB: l.MemoryMB, DiskSizeMB: l.DiskSizeMB, Metadata: l.Metadata,
		State: l.State, EnvdVersion: l.EnvdVersion, AllowInternetAccess: ptr(!rec.Policy.DenyInternet),
		Lifecycle: &wire.SandboxLifecycle{AutoResume: rec.AutoResume, OnTimeout: onTimeout},
		Network:   &wire.SandboxNetworkConfig{AllowPublicTraffic: ptr(rec.TrafficToken == "")},
	}
	if rec.MaskRequestHost != "" {
		d.Network.MaskRequestHost = ptr(rec.MaskRequestHost)
	}
	if rec.Failure != "" {
		d.Failure = ptr(rec.Failure)
	}
	d.Drives, d.VolumeMounts = driveInfo(rec.Drives), l.VolumeMounts
	if len(rec.Policy.AllowOut) > 0 {
		d.Network.AllowOut = ptr(rec.Policy.AllowOut)
	}
	if len(rec.Policy.DenyOut) > 0 {
		d.Network.DenyOut = ptr(rec.Policy.DenyOut)
	}
	if rec.Secure && rec.AccessToken != "" {
		d.EnvdAccessToken = ptr(rec.AccessToken)
	}
	if s.opts.Domain != "" {
		d.Domain = ptr(s.opts.Domain)
	}
	writeJSON(w, http.StatusOK, d)
}

// KillSandbox implements ServerInterface.
func (s *Server) KillSandbox(w http.ResponseWriter, r *http.Request, sandboxID wire.SandboxID) {
	if err := s.o.Kill(r.Context(), sandboxID); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// PauseSandbox implements ServerInterface.
func (s *Server) PauseSandbox(w http.ResponseWriter, r *http.Request, sandboxID wire.SandboxID) {
	var req wire.SandboxPauseRequest
	if !decode(w, r, &req, false) {
		return
	}
	if err := s.o.Pause(r.Context(), sandboxID, req.Memory == nil || *req.Memory); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// ResumeSandbox implements ServerInterface (deprecated): 409 when running.
func (s *Server) ResumeSandbox(w http.ResponseWriter, r *http.Request, sandboxID wire.SandboxID) {
	var req wire.ResumedSandbox
	if !decode(w, r, &req, false) {
		return
	}
	timeout, ok := s.timeout(w, req.Timeout)
	if !ok {
		return
	}
	if rec, err := s.o.Get(sandboxID); err == nil && rec.State == sandbox.Running {
		writeError(w, http.StatusConflict, "sandbox "+sandboxID+" is already running")
		return
	}
	rec, _, err := s.o.Connect(r.Context(), sandboxID, timeout, req.Memory == nil || *req.Memory)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.sandbox(rec))
}

// ConnectSandbox implements ServerInterface.
func (s *Server) ConnectSandbox(w http.ResponseWriter, r *http.Request, sandboxID wire.SandboxID) {
	s.connect(w, r, sandboxID)
}

// ConnectSandboxV2 implements ServerInterface.
func (s *Server) ConnectSandboxV2(w http.ResponseWriter, r *http.Request, sandboxID wire.SandboxID) {
	s.connect(w, r, sandboxID)
}

func (s *Server) connect(w http.ResponseWriter, r *http.Request, id string) {
	var req wire.ConnectSandbox
	if !decode(w, r, &req, false) {
		return
	}
	timeout, ok := s.timeout(w, req.Timeout)
	if !ok {
		return
	}
	rec, resumed, err := s.o.Connect(r.Context(), id, timeout, req.Memory == nil || *req.Memory)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	status := http.StatusOK
	if resumed {
		status = http.StatusCreated
	}
	writeJSON(w, status, s.sandbox(rec))
}

// SetSandboxTimeout implements ServerInterface.
func (s *Server) SetSandboxTimeout(w http.ResponseWriter, r *http.Request, sandboxID wire.SandboxID) {
	var req wire.SandboxTimeout
	if !decode(w, r, &req, true) {
		return
	}
	if req.Timeout < 0 || time.Duration(req.Timeout)*time.Second > s.opts.MaxTimeout {
		writeError(w, http.StatusBadRequest, "timeout out of range")
		return
	}
	if err := s.o.SetTimeout(sandboxID, time.Duration(req.Timeout)*time.Second, false); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// RefreshSandbox implements ServerInterface (only extends).
func (s *Server) RefreshSandbox(w http.ResponseWriter, r *http.Request, sandboxID wire.SandboxID) {
	var req wire.SandboxRefresh
	if !decode(w, r, &req, false) {
		return
	}
	d := s.opts.DefaultTimeout
	if req.Duration != nil {
		if *req.Duration < 0 || *req.Duration > 3600 {
			writeError(w, http.StatusBadRequest, "duration must be 0..3600")
			return
		}
		d = time.Duration(*req.Duration) * time.Second
	}
	if err := s.o.SetTimeout(sandboxID, d, true); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// ListTemplates implements ServerInterface.
func (s *Server) ListTemplates(w http.ResponseWriter, r *http.Request) {
	s.ListTemplatesV2(w, r)
}

// GetTemplate implements ServerInterface.
func (s *Server) GetTemplate(w http.ResponseWriter, r *http.Request, templateID string) {
	t, err := s.o.ResolveTemplate(templateID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.builtTemplate(t))
}

func ptr[T any](v T) *T { return &v }

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func derefMap(p *map[string]string) map[string]string {
	if p == nil {
		return nil
	}
	return *p
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// validHostMask reports whether a maskRequestHost can be a Host header:
// at most 253 bytes of letters, digits, '.', '-', ':' and the ${PORT}
// placeholder (anything else, such as CR/LF or spaces, would let a client
// shape the guest's request line).
func validHostMask(m string) bool {
	if m == "" || len(m) > 253 {
		return false
	}
	for _, r := range strings.ReplaceAll(m, "${PORT}", "0") {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '-' || r == ':' || r == '_') {
			return false
		}
	}
	return true
}
