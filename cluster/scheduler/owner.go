package scheduler

import (
	"context"
	"fmt"
	"strconv"

	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Ownership fencing. Every binding holds an ownership generation ("gen" in
// bind:<sandbox>), drawn from the owngen counter whenever the sandbox is
// bound to a node other than its current one. Each registration and
// heartbeat reply gives the node the generations of its roster sandboxes
// bound to it, with a lease (half of DownAfter, counted by the node from
// before it sent its request): the scheduler moves a node's sandboxes only
// after DownAfter of silence, so a node that takes its records as proof
// only within the lease never serves a sandbox moved elsewhere. Before a
// node commits a pause to the repository it asks CheckOwner with the
// generation it held when it paused: a sandbox bound elsewhere, or moved
// away and back since, is refused, and the commit is dropped.

// lease is how long a node may rely on the ownership it was told.
func (s *Scheduler) leaseFor() int64 { return (s.opts.DownAfter / 2).Milliseconds() }

// owned reads the ownership generations of the roster sandboxes bound to
// the node, and 0 for those bound to no node (stale copies left out): what
// the node may serve within the lease.
func (s *Scheduler) owned(ctx context.Context, st *pb.NodeStatus, stale []string) (map[string]int64, error) {
	roster := st.GetRoster()
	if len(roster) == 0 {
		return nil, nil
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.SliceCmd, len(roster))
	for i, e := range roster {
		cmds[i] = pipe.HMGet(ctx, s.k.bind(e.GetSandboxId()), "node", "gen")
	}
	if _, err := pipe.Exec(ctx); err != nil && !isNil(err) {
		return nil, fmt.Errorf("ownership of node %s: %w", st.GetName(), err)
	}
	out := make(map[string]int64, len(roster))
	for i, e := range roster {
		v := cmds[i].Val()
		if len(v) == 2 && v[0] == nil {
			// Reported here and bound nowhere (made on the node, bound by
			// the gateway or a roster soon): nobody else holds it; 0 names
			// no generation (the commit fence then waits for a binding).
			out[e.GetSandboxId()] = 0
			continue
		}
		if len(v) != 2 || v[0] != st.GetName() {
			continue
		}
		g, _ := v[1].(string)
		if gen, err := strconv.ParseInt(g, 10, 64); err == nil && gen > 0 {
			out[e.GetSandboxId()] = gen
		}
	}
	for _, id := range stale {
		delete(out, id)
	}
	return out, nil
}

// ownedOrNone is owned for a reply: an error is logged and answered with
// nothing (the node then proves nothing by its records: fail safe).
func (s *Scheduler) ownedOrNone(ctx context.Context, st *pb.NodeStatus, stale []string) map[string]int64 {
	out, err := s.owned(ctx, st, stale)
	if err != nil {
		s.log.Warn("could not read ownership generations", "node", st.GetName(), "err", err)
		return nil
	}
	return out
}

// CheckOwner implements pb.SchedulerServer.
func (s *Scheduler) CheckOwner(ctx context.Context, req *pb.CheckOwnerRequest) (*pb.CheckOwnerResponse, error) {
	if err := checkName("sandbox id", req.GetSandboxId()); err != nil {
		return nil, err
	}
	if err := checkName("node name", req.GetNode()); err != nil {
		return nil, err
	}
	if req.GetGen() < 0 {
		return nil, status.Error(codes.InvalidArgument, "negative ownership generation")
	}
	v, err := s.rdb.HMGet(ctx, s.k.bind(req.GetSandboxId()), "node", "gen").Result()
	if err != nil {
		return nil, internal(fmt.Errorf("check owner of %s: %w", req.GetSandboxId(), err))
	}
	holder, _ := v[0].(string)
	g, _ := v[1].(string)
	gen, _ := strconv.ParseInt(g, 10, 64)
	ok := holder == req.GetNode() && (req.GetGen() == 0 || req.GetGen() == gen)
	return &pb.CheckOwnerResponse{Owner: ok, Holder: holder, Gen: gen}, nil
}
