package scheduler

import (
	"context"
	"fmt"
	"slices"

	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
)

// staleCopies names the sandboxes of a node's roster that are stale copies:
// bound to another node that is up and reports them too. That is a node back
// from the dead holding a sandbox that was resumed elsewhere (from the
// repository) while it was down; the binding stays with the node that
// resumed it (reconcileRoster), so this node's copy is never reached and
// the node removes it.
//
// Only settled evidence counts, so that a live copy is never named: a lost
// binding (its node down) is no one's, and a binding made within
// RosterGrace may still be moving (a resume elsewhere binds only once the
// connect answered, and a roster reconciled meanwhile may have bound the
// sandbox back here for a moment).
func (s *Scheduler) staleCopies(ctx context.Context, st *pb.NodeStatus) ([]string, error) {
	name := st.GetName()
	if len(st.GetRoster()) == 0 {
		return nil, nil
	}
	mine, err := s.rdb.SMembers(ctx, s.k.nodeBinds(name)).Result()
	if err != nil {
		return nil, fmt.Errorf("stale copies on node %s: %w", name, err)
	}
	bound := make(map[string]bool, len(mine))
	for _, id := range mine {
		bound[id] = true
	}
	cutoff := s.now().UnixMilli() - s.opts.RosterGrace.Milliseconds()
	holders := map[string]*nodeRecord{}
	var out []string
	for _, e := range st.GetRoster() {
		id := e.GetSandboxId()
		if bound[id] {
			continue // the usual case: one set lookup per roster entry
		}
		b, err := s.lookup(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("stale copies on node %s: %w", name, err)
		}
		if b == nil || b.node == name || b.lost != 0 || b.at > cutoff {
			continue
		}
		other, ok := holders[b.node]
		if !ok {
			if other, err = s.loadNode(ctx, b.node); err != nil {
				other = nil // unregistered or unreadable: no evidence
			}
			holders[b.node] = other
		}
		if other == nil || s.isDown(other) || !reports(other.status, id) {
			continue
		}
		out = append(out, id)
	}
	if len(out) > 0 {
		s.log.Warn("node holds stale copies of sandboxes bound elsewhere; told to remove them", "node", name, "sandboxes", out)
	}
	return out, nil
}

// reports is a node status whose roster lists the sandbox.
func reports(st *pb.NodeStatus, id string) bool {
	return slices.ContainsFunc(st.GetRoster(), func(e *pb.RosterEntry) bool { return e.GetSandboxId() == id })
}

// staleOrNone is staleCopies for a reply: an error is logged and answered
// with no list, so the node keeps its copies (fail safe) and its heartbeat
// still counts.
func (s *Scheduler) staleOrNone(ctx context.Context, st *pb.NodeStatus) []string {
	out, err := s.staleCopies(ctx, st)
	if err != nil {
		s.log.Warn("could not tell stale copies; the node keeps them for now", "node", st.GetName(), "err", err)
		return nil
	}
	return out
}
