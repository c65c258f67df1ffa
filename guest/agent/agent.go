// Package agent assembles aenv-agent, the in-sandbox agent that speaks E2B's
// agent ("envd") protocol on port 49983: the Connect services process.Process
// and filesystem.Filesystem, and the plain HTTP endpoints /health, /metrics,
// /envs, /init and /files, behind the access-token rules of the protocol.
// The service implementations live in the sub-packages; this package owns the
// routing, the authentication middleware and the /init, /envs, /metrics handlers.
package agent

// Regenerate the Connect/protobuf Go code under gen/ (committed; CI needs no protoc):
//   apt-get install protobuf-compiler
//   go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
//   go install connectrpc.com/connect/cmd/protoc-gen-connect-go@v1.21.1
//go:generate sh -c "cd proto && protoc -I . --go_out=../gen --go_opt=module=github.com/agentenv/agentenv/guest/agent/gen --connect-go_out=../gen --connect-go_opt=module=github.com/agentenv/agentenv/guest/agent/gen process/process.proto filesystem/filesystem.proto"

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/agentenv/agentenv/guest/agent/gen/process/processconnect"
	"github.com/agentenv/agentenv/guest/agent/procsvc"
	"github.com/agentenv/agentenv/guest/agent/state"
	"github.com/agentenv/agentenv/guest/agent/users"
)

// Version is the envd protocol version the agent reports. E2B's SDKs enable
// features by it (0.6.4 or newer is required for everything we serve).
const Version = "0.6.4"

// MaxRPCMessage bounds one RPC message (e.g. a SendInput chunk); larger
// ones are refused rather than buffered.
const MaxRPCMessage = 32 << 20

// DefaultAddr is where E2B's SDKs expect the agent.
const DefaultAddr = ":49983"

// Config configures an agent.
type Config struct {
	// DefaultUser is the user requests act as when they name none; "" means
	// the user the agent runs as. /init may change it.
	DefaultUser string
	// SkipInitDuties stops /init from setting the system clock: for an agent
	// running as an ordinary process on a host.
	SkipInitDuties bool
	// Users overrides the passwd/group database (tests).
	Users  *users.DB
	Logger *slog.Logger
	// Logs, when set, holds the agent's recent log lines for GET /logs
	// (the Logger should write into it).
	Logs *LogRing
}

// Agent is the HTTP handler of the whole agent.
type Agent struct {
	cfg   Config
	st    *state.State
	log   *slog.Logger
	procs *procsvc.Service
	mux   *http.ServeMux
}

// New builds an agent.
func New(cfg Config) *Agent {
	if cfg.Users == nil {
		cfg.Users = users.NewDB()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	a := &Agent{cfg: cfg, log: cfg.Logger, st: state.New(cfg.Users, cfg.DefaultUser), mux: http.NewServeMux()}
	a.procs = procsvc.New(a.st, a.log)
	a.routes()
	return a
}

// State exposes the agent's settings (tests and embedders).
func (a *Agent) State() *state.State { return a.st }

func (a *Agent) routes() {
	a.mux.Handle(processconnect.NewProcessHandler(a.procs, a.rpcOptions()...))
	a.mountExtra()
	a.mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	a.mux.HandleFunc("POST /init", a.handleInit)
	a.mux.HandleFunc("GET /envs", a.handleEnvs)
	a.mux.HandleFunc("GET /metrics", a.handleMetrics)
	a.mux.HandleFunc("GET /logs", a.handleLogs)
}

// rpcOptions are the handler options of both Connect services.
func (a *Agent) rpcOptions() []connect.HandlerOption {
	return []connect.HandlerOption{
		connect.WithReadMaxBytes(MaxRPCMessage),
		connect.WithInterceptors(tokenInterceptor{a.st}),
	}
}

// ServeHTTP applies the access-token rule and routes.
func (a *Agent) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if cors(w, r) {
		return
	}
	if !tokenExempt(r.URL.Path) && !a.st.TokenOK(r.Header) {
		unauthorized(w)
		return
	}
	a.mux.ServeHTTP(w, r)
}

// cors lets E2B's SDK run in a browser: every origin may call the agent
// (the access token, not the origin, is the credential). It answers
// preflight requests itself and reports whether it did.
func cors(w http.ResponseWriter, r *http.Request) bool {
	if r.Header.Get("Origin") == "" {
		return false
	}
	h := w.Header()
	h.Set("Access-Control-Allow-Origin", "*")
	h.Set("Access-Control-Expose-Headers", "Grpc-Status, Grpc-Message, Grpc-Status-Details-Bin, Connect-Content-Encoding, Connect-Accept-Encoding, Content-Encoding, Content-Length, Content-Disposition, X-Envd-Version")
	if r.Method != http.MethodOptions || r.Header.Get("Access-Control-Request-Method") == "" {
		return false
	}
	h.Set("Access-Control-Allow-Methods", "GET, HEAD, POST, PUT, OPTIONS")
	if req := r.Header.Get("Access-Control-Request-Headers"); req != "" {
		h.Set("Access-Control-Allow-Headers", req)
	}
	h.Set("Access-Control-Max-Age", "7200")
	w.WriteHeader(http.StatusNoContent)
	return true
}

// WriteError writes the protocol's JSON error body {code, message}.
func WriteError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"code": status, "message": msg})
}

// initRequest is the body of POST /init.
type initRequest struct {
	EnvVars        map[string]string `json:"envVars"`
	AccessToken    *string           `json:"accessToken"`
	Timestamp      *time.Time        `json:"timestamp"`
	DefaultUser    *string           `json:"defaultUser"`
	DefaultWorkdir *string           `json:"defaultWorkdir"`
	// Drives are disks whose slot got a real disk since the guest probed
	// it (drives.go).
	Drives []string `json:"drives"`
	// HostTSCkHz is the TSC frequency of the host the guest runs on now,
	// sent by the node under TCG after every start (clockrate.go); E2B's
	// SDKs do not send it, and without it the clock's rate is left alone.
	HostTSCkHz int64 `json:"hostTscKhz"`
}

// maxInitBody bounds /init so a hostile caller cannot exhaust memory.
const maxInitBody = 1 << 20

func (a *Agent) handleInit(w http.ResponseWriter, r *http.Request) {
	var req initRequest
	if r.Body != nil && r.ContentLength != 0 {
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxInitBody))
		if err := dec.Decode(&req); err != nil && !errors.Is(err, io.EOF) {
			WriteError(w, http.StatusBadRequest, fmt.Sprintf("decode init body: %v", err))
			return
		}
	}
	if !a.initAllowed(r, req) {
		WriteError(w, http.StatusUnauthorized, "init: access token already set; send it in X-Access-Token")
		return
	}
	if err := checkDrives(req.Drives); err != nil {
		WriteError(w, http.StatusBadRequest, "init: "+err.Error())
		return
	}
	if req.HostTSCkHz > 0 && !a.cfg.SkipInitDuties {
		// Before the step: a clock at the wrong rate would drift off again.
		if err := a.correctClockRate(req.HostTSCkHz); err != nil {
			a.log.Error("init: correct the clock rate", "err", err)
		}
	}
	if req.Timestamp != nil && !a.cfg.SkipInitDuties {
		a.syncClock(*req.Timestamp)
	}
	if len(req.Drives) > 0 && !a.cfg.SkipInitDuties {
		if err := reprobeDisks("/sys", req.Drives); err != nil {
			a.log.Error("init: probe drives", "err", err)
			WriteError(w, http.StatusInternalServerError, "init: "+err.Error())
			return
		}
		a.log.Info("init: drives probed", "drives", req.Drives)
	}
	a.st.Apply(state.Settings{AccessToken: req.AccessToken, EnvVars: req.EnvVars, DefaultUser: req.DefaultUser, DefaultWorkdir: req.DefaultWorkdir})
	w.Header().Set("X-Envd-Version", Version)
	w.WriteHeader(http.StatusNoContent)
}

// initAllowed: the first /init may set anything; once a token is set, a
// re-init (after resume) must present it, or repeat the same token.
func (a *Agent) initAllowed(r *http.Request, req initRequest) bool {
	cur := a.st.Token()
	if cur == "" || state.TokenEqual(r.Header.Get(state.AccessTokenHeader), cur) {
		return true
	}
	return req.AccessToken != nil && state.TokenEqual(*req.AccessToken, cur)
}

// syncClock sets the guest clock from the host's timestamp when it drifted:
// a VM restored from a snapshot wakes up with the clock of the snapshot.
func (a *Agent) syncClock(ts time.Time) {
	if d := time.Since(ts); d > -time.Second && d < time.Second {
		return
	}
	tv := syscall.NsecToTimeval(ts.UnixNano())
	if err := syscall.Settimeofday(&tv); err != nil {
		a.log.Warn("init: set clock", "err", err)
	}
}

func (a *Agent) handleEnvs(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(a.st.Envs())
}

// Serve runs the agent until ctx ends (HTTP/1.1 and cleartext HTTP/2) on
// addr, which may list several addresses separated by commas (e.g. the IPv4
// and IPv6 loopbacks, both of which "localhost" may mean).
func Serve(ctx context.Context, addr string, h http.Handler) error {
	var lns []net.Listener
	for _, a := range strings.Split(addr, ",") {
		ln, err := net.Listen("tcp", strings.TrimSpace(a))
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return fmt.Errorf("listen %s: %w", a, err)
		}
		lns = append(lns, ln)
	}
	errc := make(chan error, len(lns))
	for _, ln := range lns {
		go func() { errc <- ServeListener(ctx, ln, h) }()
	}
	var first error
	for range lns {
		if err := <-errc; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// ServeListener is Serve on an existing listener.
func ServeListener(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 30 * time.Second}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve %s: %w", ln.Addr(), err)
	}
	return nil
}
