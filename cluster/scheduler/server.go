package scheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Limits on what a caller may send: names and ids are short, a roster is
// bounded (a node holds at most a few thousand sandboxes).
const (
	maxName   = 253
	maxRoster = 10000
	maxURL    = 2048
	maxFlags  = 1024
)

func checkName(what, s string) error {
	if s == "" || len(s) > maxName || strings.ContainsAny(s, " \t\r\n:") {
		return status.Errorf(codes.InvalidArgument, "%s %q: want 1-%d characters without spaces or colons", what, s, maxName)
	}
	return nil
}

func checkStatus(st *pb.NodeStatus) error {
	if st == nil {
		return status.Error(codes.InvalidArgument, "no node status")
	}
	if err := checkName("node name", st.GetName()); err != nil {
		return err
	}
	if u := st.GetApiUrl(); u == "" || len(u) > maxURL {
		return status.Errorf(codes.InvalidArgument, "node %s: api_url must be 1-%d characters", st.GetName(), maxURL)
	}
	if len(st.GetP2PEndpoint()) > maxURL || len(st.GetVmm()) > maxName || len(st.GetVersion()) > maxName {
		return status.Errorf(codes.InvalidArgument, "node %s: endpoint, vmm or version too long", st.GetName())
	}
	if len(st.GetAccel()) > maxName || len(st.GetCpuModel()) > maxName || len(st.GetCpuFlags()) > maxFlags || st.GetTscKhz() < 0 {
		return status.Errorf(codes.InvalidArgument, "node %s: accel, CPU model, CPU flags (at most %d) or TSC out of range", st.GetName(), maxFlags)
	}
	for _, f := range st.GetCpuFlags() {
		if f == "" || len(f) > maxName {
			return status.Errorf(codes.InvalidArgument, "node %s: CPU flag %q: want 1-%d characters", st.GetName(), f, maxName)
		}
	}
	if len(st.GetRoster()) > maxRoster {
		return status.Errorf(codes.InvalidArgument, "node %s: roster of %d sandboxes exceeds %d", st.GetName(), len(st.GetRoster()), maxRoster)
	}
	for _, e := range st.GetRoster() {
		if err := checkName("sandbox id", e.GetSandboxId()); err != nil {
			return err
		}
	}
	return nil
}

// internal wraps a storage error for the caller.
func internal(err error) error {
	if _, ok := status.FromError(err); ok && status.Code(err) != codes.Unknown {
		return err
	}
	return status.Error(codes.Unavailable, err.Error())
}

// RegisterNode implements pb.SchedulerServer.
func (s *Scheduler) RegisterNode(ctx context.Context, req *pb.RegisterNodeRequest) (*pb.RegisterNodeResponse, error) {
	if err := checkStatus(req.GetStatus()); err != nil {
		return nil, err
	}
	if err := s.putStatus(ctx, req.GetStatus()); err != nil {
		return nil, internal(err)
	}
	r, err := s.loadNode(ctx, req.GetStatus().GetName())
	if err != nil {
		return nil, internal(err)
	}
	s.log.Info("node registered", "node", req.GetStatus().GetName(), "api", req.GetStatus().GetApiUrl(),
		"sandboxes", len(req.GetStatus().GetRoster()), "draining", r.draining)
	stale := s.staleOrNone(ctx, req.GetStatus())
	return &pb.RegisterNodeResponse{HeartbeatIntervalMs: s.opts.HeartbeatInterval.Milliseconds(), Draining: r.draining,
		Stale: stale, Owned: s.ownedOrNone(ctx, req.GetStatus(), stale), LeaseMs: s.leaseFor()}, nil
}

// Heartbeat implements pb.SchedulerServer. A node the registry does not
// hold (unregistered, or Redis lost it) is told to register again.
func (s *Scheduler) Heartbeat(ctx context.Context, req *pb.HeartbeatRequest) (*pb.HeartbeatResponse, error) {
	if err := checkStatus(req.GetStatus()); err != nil {
		return nil, err
	}
	name := req.GetStatus().GetName()
	known, err := s.rdb.SIsMember(ctx, s.k.nodes(), name).Result()
	if err != nil {
		return nil, internal(fmt.Errorf("heartbeat of node %s: %w", name, err))
	}
	if !known {
		return &pb.HeartbeatResponse{Unknown: true}, nil
	}
	if err := s.putStatus(ctx, req.GetStatus()); err != nil {
		return nil, internal(err)
	}
	d, err := s.rdb.HGet(ctx, s.k.node(name), "draining").Result()
	if err != nil && !isNil(err) {
		return nil, internal(fmt.Errorf("heartbeat of node %s: %w", name, err))
	}
	stale := s.staleOrNone(ctx, req.GetStatus())
	return &pb.HeartbeatResponse{Draining: d == "1", Stale: stale, Owned: s.ownedOrNone(ctx, req.GetStatus(), stale),
		LeaseMs: s.leaseFor()}, nil
}

// UnregisterNode implements pb.SchedulerServer: the node leaves; its
// bindings are reported lost until it (or another node) reports them.
func (s *Scheduler) UnregisterNode(ctx context.Context, req *pb.UnregisterNodeRequest) (*pb.UnregisterNodeResponse, error) {
	if err := checkName("node name", req.GetName()); err != nil {
		return nil, err
	}
	name := req.GetName()
	ids, err := s.rdb.SMembers(ctx, s.k.nodeBinds(name)).Result()
	if err != nil {
		return nil, internal(fmt.Errorf("unregister node %s: %w", name, err))
	}
	now := s.now().UnixMilli()
	pipe := s.rdb.TxPipeline()
	pipe.SRem(ctx, s.k.nodes(), name)
	pipe.HSet(ctx, s.k.node(name), "state", "down")
	pipe.Del(ctx, s.k.resv(name))
	for _, id := range ids {
		pipe.HSet(ctx, s.k.bind(id), "lost", now)
		pipe.ZAdd(ctx, s.k.lost(), zmember(now, id))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, internal(fmt.Errorf("unregister node %s: %w", name, err))
	}
	s.log.Info("node unregistered", "node", name, "lostBindings", len(ids))
	return &pb.UnregisterNodeResponse{}, nil
}

// Place implements pb.SchedulerServer.
func (s *Scheduler) Place(ctx context.Context, req *pb.PlaceRequest) (*pb.PlaceResponse, error) {
	if r := req.GetResources(); r.GetCpuCount() < 0 || r.GetMemoryMb() < 0 {
		return nil, status.Error(codes.InvalidArgument, "negative resources")
	}
	if len(req.GetExclude()) > maxRoster {
		return nil, status.Error(codes.InvalidArgument, "exclude list too long")
	}
	unlock, err := s.lockPlacement(ctx)
	if err != nil {
		return nil, internal(err)
	}
	defer unlock()
	nodes, err := s.loadNodes(ctx)
	if err != nil {
		return nil, internal(err)
	}
	cands := s.eligible(nodes, req.GetResources(), req.GetExclude())
	if id := req.GetRestoreOf(); id != "" {
		if cands, err = s.restoreCandidates(ctx, id, cands, nodes, req.GetExclude()); err != nil {
			return nil, err
		}
	}
	if len(cands) == 0 {
		return nil, status.Errorf(codes.ResourceExhausted, "no node can hold %d CPUs and %d MB (%d nodes known, %d excluded)",
			req.GetResources().GetCpuCount(), req.GetResources().GetMemoryMb(), len(nodes), len(req.GetExclude()))
	}
	c, err := s.choose(ctx, cands)
	if err != nil {
		return nil, internal(err)
	}
	resv, err := s.reserve(ctx, c.name, req.GetResources())
	if err != nil {
		return nil, internal(err)
	}
	return &pb.PlaceResponse{Node: s.toPB(c.r), Reservation: resv}, nil
}

// Bind implements pb.SchedulerServer.
func (s *Scheduler) Bind(ctx context.Context, req *pb.BindRequest) (*pb.BindResponse, error) {
	if err := checkName("sandbox id", req.GetSandboxId()); err != nil {
		return nil, err
	}
	if err := checkName("node name", req.GetNode()); err != nil {
		return nil, err
	}
	known, err := s.rdb.SIsMember(ctx, s.k.nodes(), req.GetNode()).Result()
	if err != nil {
		return nil, internal(fmt.Errorf("bind to node %s: %w", req.GetNode(), err))
	}
	if !known {
		return nil, status.Errorf(codes.FailedPrecondition, "bind %s: node %s is not registered", req.GetSandboxId(), req.GetNode())
	}
	if len(req.GetReservation()) > maxName {
		return nil, status.Errorf(codes.InvalidArgument, "bind %s: reservation too long", req.GetSandboxId())
	}
	r, err := s.loadNode(ctx, req.GetNode())
	if err != nil {
		return nil, internal(err)
	}
	if err := s.bind(ctx, req.GetSandboxId(), req.GetNode(), req.GetResources(), req.GetReservation(), needsOf(r.status)); err != nil {
		return nil, internal(err)
	}
	return &pb.BindResponse{}, nil
}

// Unreserve implements pb.SchedulerServer.
func (s *Scheduler) Unreserve(ctx context.Context, req *pb.UnreserveRequest) (*pb.UnreserveResponse, error) {
	if err := checkName("node name", req.GetNode()); err != nil {
		return nil, err
	}
	if r := req.GetReservation(); r == "" || len(r) > maxName {
		return nil, status.Error(codes.InvalidArgument, fmt.Sprintf("unreserve: a reservation of 1 to %d bytes is required", maxName))
	}
	if err := s.unreserve(ctx, req.GetNode(), req.GetReservation()); err != nil {
		return nil, internal(err)
	}
	return &pb.UnreserveResponse{}, nil
}

// Unbind implements pb.SchedulerServer.
func (s *Scheduler) Unbind(ctx context.Context, req *pb.UnbindRequest) (*pb.UnbindResponse, error) {
	if err := checkName("sandbox id", req.GetSandboxId()); err != nil {
		return nil, err
	}
	if err := s.unbind(ctx, req.GetSandboxId(), ""); err != nil {
		return nil, internal(err)
	}
	return &pb.UnbindResponse{}, nil
}

// LookupNode implements pb.SchedulerServer.
func (s *Scheduler) LookupNode(ctx context.Context, req *pb.LookupNodeRequest) (*pb.LookupNodeResponse, error) {
	if err := checkName("sandbox id", req.GetSandboxId()); err != nil {
		return nil, err
	}
	b, err := s.lookup(ctx, req.GetSandboxId())
	if err != nil {
		return nil, internal(err)
	}
	if b == nil {
		return nil, status.Errorf(codes.NotFound, "sandbox %s is bound to no node", req.GetSandboxId())
	}
	r, err := s.loadNode(ctx, b.node)
	if errors.Is(err, errNoNode) {
		return &pb.LookupNodeResponse{Node: &pb.Node{Status: &pb.NodeStatus{Name: b.node}, State: pb.NodeState_NODE_STATE_DOWN}, Lost: true}, nil
	}
	if err != nil {
		return nil, internal(err)
	}
	// A binding marked lost on a node that is up again is answered with the
	// node: it came back, and either holds the sandbox (its next roster
	// clears the mark) or answers 404 (the roster then drops the binding).
	n := s.toPB(r)
	return &pb.LookupNodeResponse{Node: n, Lost: n.State == pb.NodeState_NODE_STATE_DOWN}, nil
}

// ListNodes implements pb.SchedulerServer.
func (s *Scheduler) ListNodes(ctx context.Context, _ *pb.ListNodesRequest) (*pb.ListNodesResponse, error) {
	nodes, err := s.loadNodes(ctx)
	if err != nil {
		return nil, internal(err)
	}
	out := &pb.ListNodesResponse{}
	for _, r := range nodes {
		out.Nodes = append(out.Nodes, s.toPB(r))
	}
	slices.SortFunc(out.Nodes, func(a, b *pb.Node) int { return strings.Compare(a.GetStatus().GetName(), b.GetStatus().GetName()) })
	out.Nodes = append(out.Nodes, s.unregistered(out.Nodes)...) // after the registered ones
	return out, nil
}

// ListPeers implements pb.SchedulerServer.
func (s *Scheduler) ListPeers(ctx context.Context, req *pb.ListPeersRequest) (*pb.ListPeersResponse, error) {
	nodes, err := s.ListNodes(ctx, nil)
	if err != nil {
		return nil, err
	}
	out := &pb.ListPeersResponse{}
	for _, n := range nodes.GetNodes() {
		st := n.GetStatus()
		if n.State != pb.NodeState_NODE_STATE_UP || st.GetName() == req.GetNode() || st.GetP2PEndpoint() == "" {
			continue
		}
		out.Peers = append(out.Peers, &pb.Peer{Name: st.GetName(), P2PEndpoint: st.GetP2PEndpoint()})
	}
	return out, nil
}

// Drain implements pb.SchedulerServer.
func (s *Scheduler) Drain(ctx context.Context, req *pb.DrainRequest) (*pb.DrainResponse, error) {
	if err := checkName("node name", req.GetName()); err != nil {
		return nil, err
	}
	known, err := s.rdb.SIsMember(ctx, s.k.nodes(), req.GetName()).Result()
	if err != nil {
		return nil, internal(fmt.Errorf("drain node %s: %w", req.GetName(), err))
	}
	if !known {
		return nil, status.Errorf(codes.NotFound, "node %s is not registered", req.GetName())
	}
	v := "0"
	if req.GetDraining() {
		v = "1"
	}
	if err := s.rdb.HSet(ctx, s.k.node(req.GetName()), "draining", v).Err(); err != nil {
		return nil, internal(fmt.Errorf("drain node %s: %w", req.GetName(), err))
	}
	s.log.Info("drain flag set", "node", req.GetName(), "draining", req.GetDraining())
	r, err := s.loadNode(ctx, req.GetName())
	if err != nil {
		return nil, internal(err)
	}
	return &pb.DrainResponse{Node: s.toPB(r)}, nil
}

// ListLost implements pb.SchedulerServer.
func (s *Scheduler) ListLost(ctx context.Context, _ *pb.ListLostRequest) (*pb.ListLostResponse, error) {
	zs, err := s.rdb.ZRangeWithScores(ctx, s.k.lost(), 0, maxRoster).Result()
	if err != nil {
		return nil, internal(fmt.Errorf("list lost bindings: %w", err))
	}
	out := &pb.ListLostResponse{}
	for _, z := range zs {
		id, _ := z.Member.(string)
		b, err := s.lookup(ctx, id)
		if err != nil {
			return nil, internal(err)
		}
		if b == nil {
			continue
		}
		out.Lost = append(out.Lost, &pb.LostBinding{SandboxId: id, Node: b.node, LostAtUnixMs: int64(z.Score)})
	}
	return out, nil
}
