package scheduler

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"

	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
)

// Policy chooses among the nodes that can hold a create.
type Policy string

// The placement policies.
const (
	// LeastLoaded picks the node with the fewest sandboxes per CPU, then
	// the most free memory (the default).
	LeastLoaded Policy = "least-loaded"
	// RoundRobin cycles through the eligible nodes in name order, with a
	// counter shared by every replica.
	RoundRobin Policy = "round-robin"
	// Random picks uniformly.
	Random Policy = "random"
)

// ParsePolicy checks a policy name ("" is the default).
func ParsePolicy(s string) (Policy, error) {
	switch p := Policy(s); p {
	case "":
		return LeastLoaded, nil
	case LeastLoaded, RoundRobin, Random:
		return p, nil
	}
	return "", fmt.Errorf("placement policy %q: want least-loaded, round-robin or random", s)
}

// candidate is a node that can hold the request.
type candidate struct {
	name string
	r    *nodeRecord
}

// eligible filters the nodes to those up, not draining, not excluded, whose
// free resources (less what was bound since their last heartbeat) hold the
// request.
func (s *Scheduler) eligible(nodes map[string]*nodeRecord, req *pb.Resources, exclude []string) []candidate {
	out := make([]candidate, 0, len(nodes))
	for name, r := range nodes {
		if s.isDown(r) || r.draining || slices.Contains(exclude, name) {
			continue
		}
		if !fits(r, req) {
			continue
		}
		out = append(out, candidate{name, r})
	}
	slices.SortFunc(out, func(a, b candidate) int { return cmp.Compare(a.name, b.name) })
	return out
}

func fits(r *nodeRecord, req *pb.Resources) bool {
	st := r.status
	if max := st.GetMaxSandboxes(); max > 0 && count(r) >= int64(max) {
		return false
	}
	free := st.GetFree()
	if c := int64(req.GetCpuCount()); c > 0 && int64(free.GetCpuCount())-r.pendingCPU < c {
		return false
	}
	if m := req.GetMemoryMb(); m > 0 && free.GetMemoryMb()-r.pendingMem < m {
		return false
	}
	return true
}

// count is a node's sandboxes: bound or reported, plus placements not yet
// bound (a create in progress that the roster already shows counts twice
// until its Bind: a burst errs towards spreading).
func count(r *nodeRecord) int64 {
	return max(r.bound, int64(len(r.status.GetRoster()))) + r.pendingN
}

// load is a node's sandboxes per CPU of capacity.
func load(r *nodeRecord) float64 {
	cpus := r.status.GetCapacity().GetCpuCount()
	if cpus < 1 {
		cpus = 1
	}
	return float64(count(r)) / float64(cpus)
}

func (s *Scheduler) choose(ctx context.Context, cands []candidate) (candidate, error) {
	switch s.opts.Policy {
	case RoundRobin:
		n, err := s.rdb.Incr(ctx, s.k.rr()).Result()
		if err != nil {
			return candidate{}, fmt.Errorf("round-robin counter: %w", err)
		}
		return cands[uint64(n)%uint64(len(cands))], nil
	case Random:
		return cands[rand.IntN(len(cands))], nil
	}
	return slices.MinFunc(cands, func(a, b candidate) int {
		if c := cmp.Compare(load(a.r), load(b.r)); c != 0 {
			return c
		}
		fa := a.r.status.GetFree().GetMemoryMb() - a.r.pendingMem
		fb := b.r.status.GetFree().GetMemoryMb() - b.r.pendingMem
		if c := cmp.Compare(fb, fa); c != 0 {
			return c
		}
		return cmp.Compare(a.name, b.name)
	}), nil
}
