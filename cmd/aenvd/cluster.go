package main

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentenv/agentenv/cluster/nodeagent"
	"github.com/agentenv/agentenv/config"
	"github.com/agentenv/agentenv/internal/version"
	"github.com/agentenv/agentenv/orchestrator"
	"github.com/agentenv/agentenv/replica"
)

// orchestratorSource reports the node to the cluster scheduler from the
// orchestrator's own figures.
type orchestratorSource struct {
	o          *orchestrator.Orchestrator
	overcommit int
}

func (s orchestratorSource) Usage() nodeagent.Usage {
	st := s.o.NodeStats()
	u := nodeagent.Usage{CPUs: st.CPUCount * s.overcommit, MemoryMB: st.MemTotalMiB, FreeMemoryMB: st.MemTotalMiB - st.MemUsedMiB}
	u.FreeCPUs = max(u.CPUs-st.AllocatedCPU, 0)
	for _, r := range s.o.List() {
		u.Roster = append(u.Roster, nodeagent.Sandbox{ID: r.ID, State: string(r.State), CPUs: r.VCPUs, MemoryMB: int64(r.MemoryMiB)})
	}
	return u
}

// DropCopy removes the node's stale copy of a sandbox the cluster resumed
// on another node (orchestrator.DropCopy: local state only).
func (s orchestratorSource) DropCopy(ctx context.Context, id string) (string, error) {
	st, err := s.o.DropCopy(ctx, id)
	return string(st), err
}

// clusterMember is the node's cluster membership when [cluster] lists a
// scheduler (a nil member without one: every method then does nothing).
type clusterMember struct {
	agent *nodeagent.Agent
	open  chan struct{} // closed when the agent is ready or registerWait passed
	log   *slog.Logger
	stop  func()
}

// registerWait bounds how long a starting node holds requests for the
// scheduler's first answer: a node whose scheduler is unreachable serves
// what it holds after that, without the cluster's word.
const registerWait = 15 * time.Second

// newClusterMember prepares the membership; start begins it.
func newClusterMember(cfg config.Config, o *orchestrator.Orchestrator, rn *repoNode, vmm, accel, hostname string, log *slog.Logger) (*clusterMember, error) {
	cc := cfg.Cluster
	if len(cc.Scheduler) == 0 {
		return nil, nil
	}
	name, url := cc.NodeName, cc.AdvertiseURL
	if name == "" {
		name = hostname
	}
	if url == "" {
		url = "http://" + advertiseAddr(cfg.API.Listen, cfg.Network.Prefix)
	}
	var onPeers func([]string) // layers are read from peers only with a repository
	if rn != nil {
		onPeers = rn.setPeers
	}
	log = log.With("component", "cluster")
	plat, err := nodeagent.HostCPU()
	if err != nil {
		log.Warn("host CPU unknown; placement cannot match this node's snapshots by CPU", "err", err)
	}
	plat.Accel = accel
	a, err := nodeagent.New(nodeagent.Options{Schedulers: cc.Scheduler, Name: name, APIURL: url, P2PEndpoint: cc.P2PEndpoint,
		VMM: vmm, Platform: plat, Version: version.Version(), MaxSandboxes: cc.MaxSandboxes,
		Source: orchestratorSource{o: o, overcommit: cc.CPUOvercommit}, Logger: log, OnPeers: onPeers,
		OwnershipFile: filepath.Join(cfg.DataDir, "cluster-ownership.json")})
	if err != nil {
		return nil, err
	}
	if rn != nil { // pauses are committed only while the scheduler binds the sandbox here
		rn.n.Uploads.SetFence(nodeagent.Fence{Agent: a, SandboxOf: replica.PauseOf})
	}
	return &clusterMember{agent: a, open: make(chan struct{}), log: log}, nil
}

// start registers and heartbeats in the background until leave; opened
// runs once the gate opens (at once for a node outside a cluster).
func (m *clusterMember) start(ctx context.Context, opened func()) {
	if m == nil {
		opened()
		return
	}
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = m.agent.Run(actx) }()
	go func() {
		defer wg.Done()
		if m.openWhenReady(actx, registerWait) {
			opened()
		}
	}()
	m.stop = func() { cancel(); wg.Wait(); m.agent.Close() }
}

// openWhenReady opens the gate once the agent is ready, or after wait;
// false when ctx ended first (the node is shutting down).
func (m *clusterMember) openWhenReady(ctx context.Context, wait time.Duration) bool {
	defer close(m.open)
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-m.agent.Ready():
	case <-t.C:
		m.log.Warn("no answer from the cluster scheduler yet; serving only the sandboxes this node's own records prove "+
			"it owns (the others are refused until it answers; pauses are committed to the repository only once it "+
			"confirms ownership)", "waited", wait, "proven_by_own_records", m.agent.Proven())
	case <-ctx.Done():
		return false
	}
	return true
}

// leave unregisters and waits for the membership's goroutines.
func (m *clusterMember) leave() {
	if m != nil && m.stop != nil {
		m.stop()
	}
}

// gate holds requests (but those for the paths in pass) until the gate is
// open: a node back from the dead answers for a sandbox only once the
// scheduler said which of its copies were resumed elsewhere meanwhile.
func (m *clusterMember) gate(h http.Handler, pass ...string) http.Handler {
	if m == nil {
		return h
	}
	return holdUntil(m.open, h, pass...)
}

// holdUntil serves a request once open is closed (at once for the paths in
// pass); a client that gives up first gets nothing.
func holdUntil(open <-chan struct{}, h http.Handler, pass ...string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !slices.Contains(pass, r.URL.Path) {
			select {
			case <-open:
			case <-r.Context().Done():
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// advertiseAddr is the listen address as others reach it: an unspecified
// host (0.0.0.0, "") becomes the first IPv4 address of the host's
// interfaces, by index, skipping loopback and the sandbox slots' veths.
func advertiseAddr(listen, slotPrefix string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		return listen
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return listen
	}
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagLoopback != 0 || ifc.Flags&net.FlagUp == 0 || strings.HasPrefix(ifc.Name, slotPrefix) {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
				return net.JoinHostPort(n.IP.String(), port)
			}
		}
	}
	return listen
}

// proveWait bounds how long a request on a sandbox this node cannot prove
// it owns waits for the scheduler's next answer (a heartbeat or two)
// before it is refused.
const proveWait = 5 * time.Second

// fence answers a request on a sandbox (named by sandboxOf) only while the
// node proves it still owns the sandbox (nodeagent.Agent.Vouch): a node cut
// off from the scheduler may have had it resumed on another node. Requests
// naming no sandbox (lists, creates, health) pass.
func (m *clusterMember) fence(h http.Handler, sandboxOf func(*http.Request) (string, bool), proxied bool) http.Handler {
	if m == nil {
		return h
	}
	return fenced(h, sandboxOf, m.agent.Vouch, proxied, m.log)
}

// fenced is fence with the proof as a function (tests give their own).
func fenced(h http.Handler, sandboxOf func(*http.Request) (string, bool), vouch func(context.Context, string) error,
	proxied bool, log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := sandboxOf(r)
		if !ok {
			h.ServeHTTP(w, r)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), proveWait)
		err := vouch(ctx, id)
		cancel()
		switch {
		case err == nil:
			h.ServeHTTP(w, r)
		case r.Context().Err() != nil: // the client gave up
		case errors.Is(err, nodeagent.ErrMoved) && proxied:
			// The proxy's answer for a sandbox it does not hold: the
			// gateway then asks the scheduler where it went.
			writeJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": id, "message": err.Error(), "code": http.StatusBadGateway})
		case errors.Is(err, nodeagent.ErrMoved):
			writeJSON(w, http.StatusNotFound, map[string]any{"code": http.StatusNotFound, "message": err.Error()})
		default:
			log.Warn("refused a request on a sandbox this node cannot prove it owns", "sandbox", id,
				"method", r.Method, "path", r.URL.Path, "err", err)
			w.Header().Set("Retry-After", "5")
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"code": http.StatusServiceUnavailable, "message": err.Error()})
		}
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// apiSandboxOf names the sandbox of an API request: a proxied one (the API
// port answers those too) or /sandboxes/{id}[/...] and
// /v2/sandboxes/{id}[/...]; lists and creates name none.
func apiSandboxOf(px interface {
	SandboxOf(*http.Request) (string, bool)
}) func(*http.Request) (string, bool) {
	return func(r *http.Request) (string, bool) {
		if id, ok := px.SandboxOf(r); ok {
			return id, true
		}
		rest, ok := strings.CutPrefix(strings.TrimPrefix(r.URL.Path, "/v2"), "/sandboxes/")
		if !ok {
			return "", false
		}
		id, _, _ := strings.Cut(rest, "/")
		return id, id != ""
	}
}
