// Package procsvc implements E2B's process.Process Connect service: starting
// commands (with pipes or a PTY, as any user of the guest), streaming their
// output, re-attaching to them later, and feeding them input and signals.
// Processes outlive the streams that started them; a process is forgotten
// once it ended and its end event was published.
package procsvc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	pb "github.com/agentenv/agentenv/guest/agent/gen/process"
	"github.com/agentenv/agentenv/guest/agent/gen/process/processconnect"
	"github.com/agentenv/agentenv/guest/agent/state"
	"github.com/agentenv/agentenv/guest/agent/users"
)

// KeepaliveHeader names the request header that sets the keepalive period in seconds.
const KeepaliveHeader = "Keepalive-Ping-Interval"

// defaultPath is the PATH of started processes when the agent has none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Service implements processconnect.ProcessHandler.
type Service struct {
	st  *state.State
	log *slog.Logger

	mu    sync.Mutex
	procs map[uint32]*proc
}

var _ processconnect.ProcessHandler = (*Service)(nil)

// New returns the service.
func New(st *state.State, log *slog.Logger) *Service {
	if log == nil {
		log = slog.Default()
	}
	return &Service{st: st, log: log, procs: map[uint32]*proc{}}
}

// Start starts a process and streams its events: start first, then data,
// then end, with keepalives in between.
func (s *Service) Start(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	p, err := s.start(ctx, req)
	if err != nil {
		return err
	}
	// The command's name only: its arguments may hold secrets. The line
	// reaches the guest console, which GET /sandboxes/{id}/logs reads.
	s.log.Info("process started", "pid", p.pid, "cmd", filepath.Base(req.Msg.GetProcess().GetCmd()))
	sub := p.subscribe()
	defer p.unsubscribe(sub)
	go p.run(func() { s.forget(p) })

	send := func(ev *pb.ProcessEvent) error { return stream.Send(&pb.StartResponse{Event: ev}) }
	if err := send(startEvent(p.pid)); err != nil {
		return err
	}
	return s.follow(ctx, p, sub, keepalive(req.Header().Get(KeepaliveHeader)), send)
}

// Connect re-attaches to a running process: start, then its output from now on, then end.
func (s *Service) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], stream *connect.ServerStream[pb.ConnectResponse]) error {
	p, err := s.lookup(req.Msg.GetProcess())
	if err != nil {
		return err
	}
	sub := p.subscribe()
	defer p.unsubscribe(sub)
	send := func(ev *pb.ProcessEvent) error { return stream.Send(&pb.ConnectResponse{Event: ev}) }
	if err := send(startEvent(p.pid)); err != nil {
		return err
	}
	return s.follow(ctx, p, sub, keepalive(req.Header().Get(KeepaliveHeader)), send)
}

// List returns the running processes.
func (s *Service) List(ctx context.Context, req *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	s.mu.Lock()
	out := make([]*pb.ProcessInfo, 0, len(s.procs))
	for _, p := range s.procs {
		out = append(out, &pb.ProcessInfo{Config: p.cfg, Pid: p.pid, Tag: p.tag})
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Pid < out[j].Pid })
	return connect.NewResponse(&pb.ListResponse{Processes: out}), nil
}

// Update resizes the PTY of a process.
func (s *Service) Update(ctx context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	p, err := s.lookup(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if sz := req.Msg.GetPty().GetSize(); sz != nil {
		if err := p.resize(sz); err != nil {
			return nil, inputError("resize pty", p.pid, err)
		}
	}
	return connect.NewResponse(&pb.UpdateResponse{}), nil
}

// SendInput writes to a process's stdin or PTY.
func (s *Service) SendInput(ctx context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	p, err := s.lookup(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if err := p.writeInput(req.Msg.GetInput()); err != nil {
		return nil, inputError("send input", p.pid, err)
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

// StreamInput writes an ordered stream of input chunks; the first message selects the process.
func (s *Service) StreamInput(ctx context.Context, stream *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	var p *proc
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *pb.StreamInputRequest_Start:
			found, err := s.lookup(ev.Start.GetProcess())
			if err != nil {
				return nil, err
			}
			p = found
		case *pb.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("stream input: data before start"))
			}
			if err := p.writeInput(ev.Data.GetInput()); err != nil {
				return nil, inputError("stream input", p.pid, err)
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.StreamInputResponse{}), nil
}

// SendSignal delivers SIGTERM or SIGKILL to a process (and its process group).
func (s *Service) SendSignal(ctx context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	p, err := s.lookup(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case pb.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case pb.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("send signal to %d: unsupported signal %v", p.pid, req.Msg.GetSignal()))
	}
	if err := p.signal(sig); errors.Is(err, errEnded) {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("send signal to %d: %w", p.pid, err))
	} else if err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("send signal %v to %d: %w", sig, p.pid, err))
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

// CloseStdin closes a process's stdin pipe so that it reads EOF.
func (s *Service) CloseStdin(ctx context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	p, err := s.lookup(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if p.tty != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("close stdin of %d: %w (send Ctrl-D instead)", p.pid, errNoStdin))
	}
	if err := p.closeStdin(); err != nil {
		return nil, inputError("close stdin", p.pid, err)
	}
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}

// follow forwards a subscriber's events to a stream until the process ended
// (then the end event is sent) or the client went away (the process lives on).
func (s *Service) follow(ctx context.Context, p *proc, sub *subscriber, ka time.Duration, send func(*pb.ProcessEvent) error) error {
	var tick <-chan time.Time
	if ka > 0 {
		t := time.NewTicker(ka)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case ev := <-sub.ch:
			if err := send(ev); err != nil {
				return err
			}
		case <-p.done:
			return s.sendRest(p, sub, send)
		case <-tick:
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// sendRest sends the data still queued for sub and then the end event.
func (s *Service) sendRest(p *proc, sub *subscriber, send func(*pb.ProcessEvent) error) error {
	for {
		select {
		case ev := <-sub.ch:
			if err := send(ev); err != nil {
				return err
			}
		default:
			return send(&pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: p.endEvent()}})
		}
	}
}

func (s *Service) start(ctx context.Context, req *connect.Request[pb.StartRequest]) (*proc, error) {
	cfg := req.Msg.GetProcess()
	if cfg.GetCmd() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("start process: empty cmd"))
	}
	u, err := s.st.RequestUser(req.Header())
	if err != nil {
		return nil, userError(err)
	}
	spec, err := s.specFor(cfg, u)
	if err != nil {
		return nil, err
	}
	spec.pty = req.Msg.Pty
	spec.stdin = req.Msg.Stdin == nil || req.Msg.GetStdin()
	p, err := spawn(spec)
	if err != nil {
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("start process %q: %w", cfg.GetCmd(), err))
	}
	p.cfg = cfg
	p.tag = req.Msg.Tag
	s.mu.Lock()
	s.procs[p.pid] = p
	s.mu.Unlock()
	s.bound(ctx, p)
	s.log.Debug("process started", "pid", p.pid, "cmd", cfg.GetCmd(), "user", u.Name)
	return p, nil
}

// bound kills the process at the request's deadline (Connect-Timeout-Ms):
// the timeout of a Start bounds the process, not only the stream.
func (s *Service) bound(ctx context.Context, p *proc) {
	dl, ok := ctx.Deadline()
	if !ok {
		return
	}
	t := time.AfterFunc(time.Until(dl), func() {
		s.log.Debug("process deadline reached", "pid", p.pid)
		_ = p.signal(syscall.SIGKILL)
	})
	go func() { <-p.done; t.Stop() }()
}

func (s *Service) specFor(cfg *pb.ProcessConfig, u *users.User) (spawnSpec, error) {
	spec := spawnSpec{args: cfg.GetArgs(), env: s.environ(cfg, u)}
	path, err := lookPath(cfg.GetCmd(), spec.env)
	if err != nil {
		return spec, connect.NewError(connect.CodeNotFound, fmt.Errorf("start process: %w", err))
	}
	spec.path = path
	dir, err := workdir(cfg, u, s.st.DefaultWorkdir())
	if err != nil {
		return spec, err
	}
	spec.dir = dir
	cred, err := credential(u)
	if err != nil {
		return spec, err
	}
	spec.cred = cred
	if cred != nil {
		spec.chown = func(name string) { _ = os.Chown(name, int(u.UID), -1) }
	}
	return spec, nil
}

// workdir picks the working directory: the requested one (which must
// exist), else the default from /init, else the user's home; a default that
// does not exist falls back to "/" the way a login does.
func workdir(cfg *pb.ProcessConfig, u *users.User, def string) (string, error) {
	if cfg.Cwd != nil && cfg.GetCwd() != "" {
		dir, err := state.ResolvePath(u, cfg.GetCwd())
		if err != nil {
			return "", connect.NewError(connect.CodeInvalidArgument, err)
		}
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			return "", connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("start process: working directory %s is not a directory", dir))
		}
		return dir, nil
	}
	for _, dir := range []string{def, u.Home} {
		if dir == "" {
			continue
		}
		if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
			return dir, nil
		}
	}
	return "/", nil
}

// credential returns the credential to switch to u, or nil when the agent already runs as u.
func credential(u *users.User) (*syscall.Credential, error) {
	if uint32(os.Geteuid()) == u.UID && uint32(os.Getegid()) == u.GID {
		return nil, nil
	}
	if os.Geteuid() != 0 {
		return nil, connect.NewError(connect.CodePermissionDenied, fmt.Errorf("start process as %s: agent is not root", u.Name))
	}
	return &syscall.Credential{Uid: u.UID, Gid: u.GID, Groups: u.Groups}, nil
}

// environ builds the child's environment: a base (PATH, HOME, USER, LOGNAME,
// SHELL), then the variables from /init, then the request's own.
func (s *Service) environ(cfg *pb.ProcessConfig, u *users.User) []string {
	env := map[string]string{
		"PATH":    os.Getenv("PATH"),
		"HOME":    u.Home,
		"USER":    u.Name,
		"LOGNAME": u.Name,
	}
	if env["PATH"] == "" {
		env["PATH"] = defaultPath
	}
	if u.Shell != "" {
		env["SHELL"] = u.Shell
	}
	for k, v := range s.st.Envs() {
		env[k] = v
	}
	for k, v := range cfg.GetEnvs() {
		env[k] = v
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// lookPath finds cmd in the child's PATH (not the agent's).
func lookPath(cmd string, env []string) (string, error) {
	if filepath.IsAbs(cmd) || filepath.Base(cmd) != cmd {
		return cmd, nil
	}
	pathVar := defaultPath
	for _, kv := range env {
		if len(kv) > 5 && kv[:5] == "PATH=" {
			pathVar = kv[5:]
		}
	}
	for _, dir := range filepath.SplitList(pathVar) {
		cand := filepath.Join(dir, cmd)
		if fi, err := os.Stat(cand); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return cand, nil
		}
	}
	return "", fmt.Errorf("look up %q in PATH: %w", cmd, exec.ErrNotFound)
}

func (s *Service) lookup(sel *pb.ProcessSelector) (*proc, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch v := sel.GetSelector().(type) {
	case *pb.ProcessSelector_Pid:
		if p, ok := s.procs[v.Pid]; ok {
			return p, nil
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", v.Pid))
	case *pb.ProcessSelector_Tag:
		for _, p := range s.procs {
			if p.tag != nil && *p.tag == v.Tag {
				return p, nil
			}
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with tag %q not found", v.Tag))
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process selector is empty"))
	}
}

func (s *Service) forget(p *proc) {
	s.mu.Lock()
	if s.procs[p.pid] == p {
		delete(s.procs, p.pid)
	}
	s.mu.Unlock()
	s.log.Debug("process ended", "pid", p.pid, "exit", p.endEvent().GetExitCode())
}

func startEvent(pid uint32) *pb.ProcessEvent {
	return &pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: pid}}}
}

// keepalive parses the keepalive header (seconds); 0 disables keepalives.
func keepalive(v string) time.Duration {
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0
	}
	return time.Duration(n) * time.Second
}

func userError(err error) error {
	if errors.Is(err, users.ErrUnknown) {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	return connect.NewError(connect.CodeInternal, err)
}

func inputError(op string, pid uint32, err error) error {
	code := connect.CodeInternal
	if errors.Is(err, errNoPTY) || errors.Is(err, errNoStdin) || errors.Is(err, errEmptyInput) {
		code = connect.CodeFailedPrecondition
	}
	return connect.NewError(code, fmt.Errorf("%s for %d: %w", op, pid, err))
}
