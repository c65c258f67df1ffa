package scheduler

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/redis/go-redis/v9"
)

// fpMarkDown sits before the leader marks a silent node down: a leader that
// dies there leaves the node up until the next leader's pass.
var fpMarkDown = failpoint.New("scheduler/reconcile/markdown")

// errFenced is a leader write refused because the lease moved on.
var errFenced = errors.New("reconciliation lease no longer held")

// markDownScript marks a node down and its bindings lost, if the caller
// still holds the lease and the node sent no heartbeat since it looked.
// KEYS: leader, node, nodebinds, lost. ARGV: token, observed last, now,
// prefix. Returns the lost sandbox ids, or -1 when fenced, -2 when the node
// came back.
var markDownScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
if redis.call('HGET', KEYS[2], 'last') ~= ARGV[2] then return -2 end
redis.call('HSET', KEYS[2], 'state', 'down')
local ids = redis.call('SMEMBERS', KEYS[3])
for _, id in ipairs(ids) do
  redis.call('HSET', ARGV[4] .. 'bind:' .. id, 'lost', ARGV[3])
  redis.call('ZADD', KEYS[4], ARGV[3], id)
end
return ids`)

// fencedBindScript rebinds a sandbox found in a node's roster. KEYS:
// leader, bind, nodebinds(node), lost. ARGV: token, id, node, cpu, mem, now,
// prefix, needs (as bindScript, a move takes a new ownership generation).
var fencedBindScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local old = redis.call('HGET', KEYS[2], 'node')
if old and old ~= ARGV[3] then redis.call('SREM', ARGV[7] .. 'nodebinds:' .. old, ARGV[2]) end
if old ~= ARGV[3] then redis.call('HSET', KEYS[2], 'gen', redis.call('INCR', ARGV[7] .. 'owngen')) end
redis.call('HSET', KEYS[2], 'node', ARGV[3], 'cpu', ARGV[4], 'mem', ARGV[5], 'at', ARGV[6], 'needs', ARGV[8])
redis.call('HDEL', KEYS[2], 'lost')
redis.call('ZREM', KEYS[4], ARGV[2])
redis.call('SADD', KEYS[3], ARGV[2])
return 1`)

// fencedUnbindScript drops a binding the node no longer reports, unless it
// was bound after the cutoff (a create the roster predates). KEYS: leader,
// bind, nodebinds(node), lost. ARGV: token, id, node, cutoff ms.
var fencedUnbindScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
if redis.call('HGET', KEYS[2], 'node') ~= ARGV[3] then return 0 end
local at = tonumber(redis.call('HGET', KEYS[2], 'at') or '0')
if at and at > tonumber(ARGV[4]) then return 0 end
redis.call('DEL', KEYS[2])
redis.call('SREM', KEYS[3], ARGV[2])
redis.call('ZREM', KEYS[4], ARGV[2])
return 1`)

// reconcile is one pass of the leader: silent nodes go down, rosters of
// live nodes correct their bindings.
func (s *Scheduler) reconcile(ctx context.Context) error {
	tok := s.current()
	if tok == "" {
		return nil
	}
	nodes, err := s.loadNodes(ctx)
	if err != nil {
		return err
	}
	lostIDs, err := s.rdb.ZRange(ctx, s.k.lost(), 0, -1).Result()
	if err != nil {
		return fmt.Errorf("read lost bindings: %w", err)
	}
	lost := make(map[string]bool, len(lostIDs))
	for _, id := range lostIDs {
		lost[id] = true
	}
	for name, r := range nodes {
		if r.down {
			continue
		}
		if s.isDown(r) {
			if err := s.markDown(ctx, tok, name, r); err != nil {
				return err
			}
			continue
		}
		if err := s.reconcileRoster(ctx, tok, name, r, lost, nodes); err != nil {
			return err
		}
	}
	return nil
}

func (s *Scheduler) markDown(ctx context.Context, tok, name string, r *nodeRecord) error {
	if err := fpMarkDown.Inject(); err != nil {
		return fmt.Errorf("mark node %s down: %w", name, err)
	}
	now := s.now().UnixMilli()
	v, err := markDownScript.Run(ctx, s.rdb, []string{s.k.leader(), s.k.node(name), s.k.nodeBinds(name), s.k.lost()},
		tok, r.last, now, s.k.p).Result()
	if err != nil {
		return fmt.Errorf("mark node %s down: %w", name, err)
	}
	switch x := v.(type) {
	case int64:
		if x == -1 {
			return errFenced
		}
		return nil // a heartbeat arrived meanwhile
	case []any:
		lost := make([]string, 0, len(x))
		for _, id := range x {
			if s, ok := id.(string); ok {
				lost = append(lost, s)
			}
		}
		s.log.Warn("node down: no heartbeat", "node", name,
			"silentFor", s.now().Sub(time.UnixMilli(r.last)).Round(time.Millisecond), "lostBindings", lost)
	}
	return nil
}

// reconcileRoster binds what the node reports holding and unbinds what it
// no longer reports (bindings made within RosterGrace of the heartbeat are
// left alone: the roster may predate them). A lost binding the node reports
// is found again.
func (s *Scheduler) reconcileRoster(ctx context.Context, tok, name string, r *nodeRecord, lost map[string]bool, nodes map[string]*nodeRecord) error {
	members, err := s.rdb.SMembers(ctx, s.k.nodeBinds(name)).Result()
	if err != nil {
		return fmt.Errorf("read bindings of node %s: %w", name, err)
	}
	bound := make(map[string]bool, len(members))
	for _, id := range members {
		bound[id] = true
	}
	reported := make(map[string]bool, len(r.status.GetRoster()))
	for _, e := range r.status.GetRoster() {
		reported[e.GetSandboxId()] = true
		if bound[e.GetSandboxId()] && !lost[e.GetSandboxId()] {
			continue
		}
		if !lost[e.GetSandboxId()] {
			held, err := s.heldElsewhere(ctx, e.GetSandboxId(), name, nodes)
			if err != nil {
				return err
			}
			if held {
				continue
			}
		}
		if err := s.fenced(ctx, fencedBindScript, []string{s.k.leader(), s.k.bind(e.GetSandboxId()), s.k.nodeBinds(name), s.k.lost()},
			tok, e.GetSandboxId(), name, e.GetResources().GetCpuCount(), e.GetResources().GetMemoryMb(), s.now().UnixMilli(), s.k.p, needsOf(r.status)); err != nil {
			return fmt.Errorf("bind %s from the roster of %s: %w", e.GetSandboxId(), name, err)
		}
		s.log.Info("bound from roster", "sandbox", e.GetSandboxId(), "node", name)
	}
	cutoff := r.last - s.opts.RosterGrace.Milliseconds()
	for id := range bound {
		if reported[id] {
			continue
		}
		if err := s.fenced(ctx, fencedUnbindScript, []string{s.k.leader(), s.k.bind(id), s.k.nodeBinds(name), s.k.lost()},
			tok, id, name, cutoff); err != nil {
			return fmt.Errorf("unbind %s missing from the roster of %s: %w", id, name, err)
		}
	}
	return nil
}

// heldElsewhere is a sandbox bound to another live node that reports it
// too: a node back from the dead still holding a sandbox that was resumed
// elsewhere meanwhile (from the repository) must not take its binding back.
func (s *Scheduler) heldElsewhere(ctx context.Context, id, name string, nodes map[string]*nodeRecord) (bool, error) {
	b, err := s.lookup(ctx, id)
	if err != nil {
		return false, fmt.Errorf("roster of %s: %w", name, err)
	}
	if b == nil || b.node == name || b.lost != 0 {
		return false, nil
	}
	other := nodes[b.node]
	if other == nil || other.down || s.isDown(other) {
		return false, nil
	}
	for _, e := range other.status.GetRoster() {
		if e.GetSandboxId() == id {
			s.log.Warn("roster reports a sandbox another live node holds; binding left", "sandbox", id, "node", name, "holder", b.node)
			return true, nil
		}
	}
	return false, nil
}

func (s *Scheduler) fenced(ctx context.Context, sc *redis.Script, keys []string, args ...any) error {
	v, err := sc.Run(ctx, s.rdb, keys, args...).Int64()
	if err != nil {
		return err
	}
	if v == -1 {
		return errFenced
	}
	return nil
}
