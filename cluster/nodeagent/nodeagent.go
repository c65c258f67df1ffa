// Package nodeagent is a node's side of the cluster: it registers the node
// with an aenv-scheduler, heartbeats its capacity, free resources and
// sandbox roster, follows the scheduler's drain flag, removes the stale
// copies the scheduler names (stale.go), tells when the scheduler first
// answered (Ready), and unregisters on a graceful shutdown. It reads the node through Source and talks to the
// scheduler only over cluster/schedulerpb.
package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Source is the node as the agent sees it: what it reads at every
// heartbeat, and the removal of a stale copy (stale.go).
type Source interface {
	Usage() Usage
	// DropCopy removes the node's own copy of a sandbox that lives on
	// another node (its record, VM and local files; nothing shared) and
	// returns the state the copy was in.
	DropCopy(ctx context.Context, id string) (state string, err error)
}

// Usage is the node's capacity, free resources and sandboxes now.
type Usage struct {
	CPUs, FreeCPUs         int
	MemoryMB, FreeMemoryMB int64
	Roster                 []Sandbox
}

// Sandbox is one roster entry.
type Sandbox struct {
	ID, State string
	CPUs      int
	MemoryMB  int64
}

// Options configures the agent.
type Options struct {
	// Schedulers are gRPC addresses (host:port); the agent uses one and
	// moves to the next when it fails.
	Schedulers []string
	// Name, APIURL, P2PEndpoint, VMM and Version describe the node.
	Name, APIURL, P2PEndpoint, VMM, Version string
	// Platform is what this node's snapshots need to be restored.
	Platform Platform
	// MaxSandboxes bounds what placement sends here (0: no bound).
	MaxSandboxes int
	Source       Source
	Logger       *slog.Logger
	// RetryInterval paces registration attempts (default 1s).
	RetryInterval time.Duration
	// OwnershipFile keeps the ownership the scheduler told (owner.go)
	// across restarts ("": in memory only).
	OwnershipFile string
	// OnPeers, when set, gets the other nodes' P2P endpoints (of the nodes
	// that are up) after every registration and heartbeat: where this node
	// reads layers before the object store.
	OnPeers func(endpoints []string)
}

// Agent is the node's membership. Run owns its goroutine.
type Agent struct {
	opts     Options
	conns    []*grpc.ClientConn
	clients  []pb.SchedulerClient
	cur      int
	interval time.Duration
	draining atomic.Bool
	log      *slog.Logger
	drops    drops
	owners   owners
	proof    proof

	ready     chan struct{} // closed once, by markReady
	readyOnce sync.Once
}

// New dials (lazily) every scheduler address.
func New(opts Options) (*Agent, error) {
	if len(opts.Schedulers) == 0 || opts.Name == "" || opts.APIURL == "" || opts.Source == nil {
		return nil, errors.New("nodeagent: schedulers, name, API URL and source are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.RetryInterval <= 0 {
		opts.RetryInterval = time.Second
	}
	a := &Agent{opts: opts, interval: 2 * time.Second, log: opts.Logger.With("node", opts.Name), ready: make(chan struct{}),
		owners: owners{path: opts.OwnershipFile}}
	if err := a.owners.load(); err != nil {
		a.log.Warn("ownership records unreadable; this node proves no ownership until the scheduler answers", "err", err)
	}
	for _, addr := range opts.Schedulers {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			a.Close()
			return nil, fmt.Errorf("nodeagent: scheduler %s: %w", addr, err)
		}
		a.conns = append(a.conns, cc)
		a.clients = append(a.clients, pb.NewSchedulerClient(cc))
	}
	return a, nil
}

// Close drops the connections (after Run returned).
func (a *Agent) Close() {
	for _, cc := range a.conns {
		_ = cc.Close()
	}
}

// Ready is closed once the scheduler first answered this node and the stale
// copies it named then are removed: from that moment the node serves only
// sandboxes that are its own. A node back from the dead may hold copies that
// were resumed elsewhere meanwhile; until Ready it cannot tell them apart.
func (a *Agent) Ready() <-chan struct{} { return a.ready }

// markReady closes Ready after the first answer (and its removals).
func (a *Agent) markReady() {
	a.readyOnce.Do(func() {
		a.drops.wait()
		close(a.ready)
	})
}

// Draining reports the scheduler's drain flag as last heard.
func (a *Agent) Draining() bool { return a.draining.Load() }

func (a *Agent) status() *pb.NodeStatus {
	u := a.opts.Source.Usage()
	st := &pb.NodeStatus{Name: a.opts.Name, ApiUrl: a.opts.APIURL, P2PEndpoint: a.opts.P2PEndpoint, Vmm: a.opts.VMM,
		Version: a.opts.Version, MaxSandboxes: int32(a.opts.MaxSandboxes),
		Accel: a.opts.Platform.Accel, CpuModel: a.opts.Platform.CPUModel, CpuFlags: a.opts.Platform.CPUFlags,
		TscKhz:   a.opts.Platform.TSCkHz,
		Capacity: &pb.Resources{CpuCount: int32(u.CPUs), MemoryMb: u.MemoryMB},
		Free:     &pb.Resources{CpuCount: int32(u.FreeCPUs), MemoryMb: u.FreeMemoryMB}}
	for _, s := range u.Roster {
		if a.drops.isBusy(s.ID) {
			continue // being removed: no longer this node's
		}
		st.Roster = append(st.Roster, &pb.RosterEntry{SandboxId: s.ID, State: s.State,
			Resources: &pb.Resources{CpuCount: int32(s.CPUs), MemoryMb: s.MemoryMB}})
	}
	return st
}

// client is the scheduler in use; next moves on after a failure.
func (a *Agent) client() pb.SchedulerClient { return a.clients[a.cur] }
func (a *Agent) next()                      { a.cur = (a.cur + 1) % len(a.clients) }

// Run registers, heartbeats until ctx ends, then unregisters (a graceful
// shutdown: the scheduler stops placing here at once). Scheduler failures
// are logged and retried; Run returns only when ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	registered := false
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			a.drops.wait()
			a.unregister(context.WithoutCancel(ctx), registered)
			return nil
		case <-t.C:
		}
		wait := a.opts.RetryInterval
		var err error
		if !registered {
			err = a.register(ctx)
		} else {
			err = a.heartbeat(ctx)
		}
		switch {
		case errors.Is(err, errUnknown):
			registered = false
			wait = 0
		case err != nil && ctx.Err() == nil:
			a.log.Warn("cluster scheduler unreachable; trying the next", "scheduler", a.opts.Schedulers[a.cur], "err", err)
			a.next()
		case err == nil:
			registered, wait = true, a.interval
			a.markReady()
			a.refreshPeers(ctx)
		}
		t.Reset(wait)
	}
}

var errUnknown = errors.New("scheduler does not know this node")

func (a *Agent) register(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st := a.status()
	sent := time.Now()
	r, err := a.client().RegisterNode(cctx, &pb.RegisterNodeRequest{Status: st})
	if err != nil {
		return fmt.Errorf("register node %s: %w", a.opts.Name, err)
	}
	// The stale copies are marked as being removed before the lease is
	// renewed: no request on one is served in between (proof.go).
	a.dropStale(ctx, st, r.GetStale())
	a.recordOwned(r.GetOwned(), r.GetLeaseMs(), r.GetStale(), st, sent)
	if ms := r.GetHeartbeatIntervalMs(); ms > 0 {
		a.interval = time.Duration(ms) * time.Millisecond
	}
	a.setDraining(r.GetDraining())
	a.log.Info("registered with the cluster scheduler", "scheduler", a.opts.Schedulers[a.cur], "heartbeat", a.interval)
	return nil
}

func (a *Agent) heartbeat(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st := a.status()
	sent := time.Now()
	r, err := a.client().Heartbeat(cctx, &pb.HeartbeatRequest{Status: st})
	if err != nil {
		return fmt.Errorf("heartbeat of node %s: %w", a.opts.Name, err)
	}
	if r.GetUnknown() {
		return errUnknown
	}
	// The stale copies are marked as being removed before the lease is
	// renewed: no request on one is served in between (proof.go).
	a.dropStale(ctx, st, r.GetStale())
	a.recordOwned(r.GetOwned(), r.GetLeaseMs(), r.GetStale(), st, sent)
	a.setDraining(r.GetDraining())
	return nil
}

func (a *Agent) setDraining(d bool) {
	if a.draining.Swap(d) != d {
		a.log.Info("cluster drain flag changed", "draining", d)
	}
}

func (a *Agent) unregister(ctx context.Context, registered bool) {
	if !registered {
		return
	}
	for range a.clients {
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := a.client().UnregisterNode(cctx, &pb.UnregisterNodeRequest{Name: a.opts.Name})
		cancel()
		if err == nil {
			a.log.Info("unregistered from the cluster scheduler")
			return
		}
		a.log.Warn("unregister from the cluster scheduler", "err", err)
		a.next()
	}
}
