package scheduler

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/proto"
)

// The Redis layout (every key under the configured prefix):
//
//	nodes              set of node names
//	node:<name>        hash: status (NodeStatus, protobuf), last (ms of the
//	                   last heartbeat), state ("up"|"down"), draining ("1"),
//	                   pcount, pcpu, pmem (placements not yet bound nor in
//	                   a roster: reserved by Place, released by Bind, cleared
//	                   by the next heartbeat, whose roster holds them)
//	bind:<sandbox>     hash: node, cpu, mem, at (ms bound), lost (ms),
//	                   gen (ownership generation: a new value of owngen
//	                   whenever the sandbox is bound to another node),
//	                   needs (the platform its snapshot needs, restore.go)
//	owngen             counter the ownership generations are drawn from
//	nodebinds:<name>   set of the sandbox ids bound to the node
//	lost               sorted set: sandbox id by the time its node went down
//	leader, epoch      the reconciliation lease and its fencing counter
//	rr                 round-robin counter
//
// Scripts name some keys they build from the prefix instead of declaring
// them: the scheduler runs on one Redis (or a Sentinel pair), not Redis
// Cluster.
type keys struct{ p string }

func (k keys) nodes() string                { return k.p + "nodes" }
func (k keys) node(name string) string      { return k.p + "node:" + name }
func (k keys) bind(id string) string        { return k.p + "bind:" + id }
func (k keys) nodeBinds(name string) string { return k.p + "nodebinds:" + name }
func (k keys) lost() string                 { return k.p + "lost" }
func (k keys) leader() string               { return k.p + "leader" }
func (k keys) epoch() string                { return k.p + "epoch" }
func (k keys) rr() string                   { return k.p + "rr" }
func (k keys) resv(name string) string      { return k.p + "resv:" + name }

// nodeRecord is a node as stored, decoded.
type nodeRecord struct {
	status     *pb.NodeStatus
	last       int64 // ms
	down       bool
	draining   bool
	pendingN   int64
	pendingCPU int64
	pendingMem int64
	bound      int64 // bindings on the node
}

// errNoNode is a node name the registry does not hold.
var errNoNode = errors.New("no such node")

// decodeNode parses a node hash read from Redis; a damaged record is an
// error, never a panic.
func decodeNode(name string, h map[string]string) (*nodeRecord, error) {
	if len(h) == 0 {
		return nil, fmt.Errorf("node %s: %w", name, errNoNode)
	}
	st := &pb.NodeStatus{}
	if err := proto.Unmarshal([]byte(h["status"]), st); err != nil {
		return nil, fmt.Errorf("decode node %s status: %w", name, err)
	}
	r := &nodeRecord{status: st, down: h["state"] == "down", draining: h["draining"] == "1"}
	var err error
	for _, f := range []struct {
		key string
		dst *int64
	}{{"last", &r.last}} {
		v, ok := h[f.key]
		if !ok || v == "" {
			continue
		}
		if *f.dst, err = strconv.ParseInt(v, 10, 64); err != nil {
			return nil, fmt.Errorf("decode node %s field %s: %w", name, f.key, err)
		}
	}
	return r, nil
}

// loadNodes reads every registered node in one round trip per stage.
func (s *Scheduler) loadNodes(ctx context.Context) (map[string]*nodeRecord, error) {
	names, err := s.rdb.SMembers(ctx, s.k.nodes()).Result()
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	pipe := s.rdb.Pipeline()
	hs := make([]*redis.MapStringStringCmd, len(names))
	cs := make([]*redis.IntCmd, len(names))
	rs := make([]*redis.StringSliceCmd, len(names))
	now := strconv.FormatInt(s.now().UnixMilli(), 10)
	for i, n := range names {
		hs[i] = pipe.HGetAll(ctx, s.k.node(n))
		cs[i] = pipe.SCard(ctx, s.k.nodeBinds(n))
		rs[i] = pipe.ZRangeByScore(ctx, s.k.resv(n), &redis.ZRangeBy{Min: "(" + now, Max: "+inf"})
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read nodes: %w", err)
	}
	out := make(map[string]*nodeRecord, len(names))
	for i, n := range names {
		r, err := decodeNode(n, hs[i].Val())
		if errors.Is(err, errNoNode) {
			continue // unregistered between the two reads
		}
		if err != nil {
			s.log.Warn("skipping a damaged node record", "node", n, "err", err)
			continue
		}
		r.bound = cs[i].Val()
		r.addReservations(rs[i].Val())
		out[n] = r
	}
	return out, nil
}

// loadNode reads one node.
func (s *Scheduler) loadNode(ctx context.Context, name string) (*nodeRecord, error) {
	h, err := s.rdb.HGetAll(ctx, s.k.node(name)).Result()
	if err != nil {
		return nil, fmt.Errorf("read node %s: %w", name, err)
	}
	r, err := decodeNode(name, h)
	if err != nil {
		return nil, err
	}
	r.bound, err = s.rdb.SCard(ctx, s.k.nodeBinds(name)).Result()
	if err != nil {
		return nil, fmt.Errorf("count bindings of node %s: %w", name, err)
	}
	return r, nil
}

// isDown is a node marked down, or silent for longer than DownAfter (placement
// and lookups do not wait for the leader to mark it).
func (s *Scheduler) isDown(r *nodeRecord) bool {
	return r.down || s.now().Sub(time.UnixMilli(r.last)) > s.opts.DownAfter
}

func (s *Scheduler) toPB(r *nodeRecord) *pb.Node {
	st := pb.NodeState_NODE_STATE_UP
	if s.isDown(r) {
		st = pb.NodeState_NODE_STATE_DOWN
	}
	return &pb.Node{Status: r.status, State: st, Draining: r.draining, LastHeartbeatUnixMs: r.last,
		Sandboxes: int32(r.bound)}
}

// putStatus writes a node's reported status and marks it up. Reservations
// are cleared: the node's roster and free figures now include them.
func (s *Scheduler) putStatus(ctx context.Context, st *pb.NodeStatus) error {
	b, err := proto.Marshal(st)
	if err != nil {
		return fmt.Errorf("encode node %s: %w", st.GetName(), err)
	}
	_, err = s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.SAdd(ctx, s.k.nodes(), st.GetName())
		p.HSet(ctx, s.k.node(st.GetName()), "status", b, "last", s.now().UnixMilli(), "state", "up")
		return nil
	})
	if err != nil {
		return fmt.Errorf("store node %s: %w", st.GetName(), err)
	}
	return nil
}

// bindScript moves a binding to a node atomically: off the old node's set,
// onto the new one's, no longer lost, and (for a create the gateway placed)
// the placement's reservation on the node released (none for a sandbox no
// Place put there: a fork child, a resume elsewhere's own placement aside).
// A binding to another node takes a new ownership generation (fencing:
// the old node's commits are refused from then on).
// KEYS: bind, nodebinds(new), resv(new), lost. ARGV: id, node, cpu, mem,
// at, prefix, reservation ("" for none), needs.
var bindScript = redis.NewScript(`
local old = redis.call('HGET', KEYS[1], 'node')
if old and old ~= ARGV[2] then redis.call('SREM', ARGV[6] .. 'nodebinds:' .. old, ARGV[1]) end
if old ~= ARGV[2] then redis.call('HSET', KEYS[1], 'gen', redis.call('INCR', ARGV[6] .. 'owngen')) end
redis.call('HSET', KEYS[1], 'node', ARGV[2], 'cpu', ARGV[3], 'mem', ARGV[4], 'at', ARGV[5], 'needs', ARGV[8])
redis.call('HDEL', KEYS[1], 'lost')
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[5])
if ARGV[7] ~= '' then redis.call('ZREM', KEYS[3], ARGV[7]) end
return 1`)

// bind binds id to node and gives back the reservation named ("": none);
// needs is the node's platform (needsOf).
func (s *Scheduler) bind(ctx context.Context, id, node string, res *pb.Resources, reservation string, needs []byte) error {
	err := bindScript.Run(ctx, s.rdb, []string{s.k.bind(id), s.k.nodeBinds(node), s.k.resv(node), s.k.lost()},
		id, node, res.GetCpuCount(), res.GetMemoryMb(), s.now().UnixMilli(), s.k.p, reservation, needs).Err()
	if err != nil {
		return fmt.Errorf("bind sandbox %s to node %s: %w", id, node, err)
	}
	return nil
}

// unbindScript forgets a binding. KEYS: bind, lost. ARGV: id, prefix,
// expected node ("" for any).
var unbindScript = redis.NewScript(`
local node = redis.call('HGET', KEYS[1], 'node')
if not node then return 0 end
if ARGV[3] ~= '' and node ~= ARGV[3] then return 0 end
redis.call('SREM', ARGV[2] .. 'nodebinds:' .. node, ARGV[1])
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
return 1`)

func (s *Scheduler) unbind(ctx context.Context, id, onlyNode string) error {
	if err := unbindScript.Run(ctx, s.rdb, []string{s.k.bind(id), s.k.lost()}, id, s.k.p, onlyNode).Err(); err != nil {
		return fmt.Errorf("unbind sandbox %s: %w", id, err)
	}
	return nil
}

// binding is one sandbox's stored binding.
type binding struct {
	node string
	at   int64
	lost int64
}

func (s *Scheduler) lookup(ctx context.Context, id string) (*binding, error) {
	h, err := s.rdb.HGetAll(ctx, s.k.bind(id)).Result()
	if err != nil {
		return nil, fmt.Errorf("read binding of %s: %w", id, err)
	}
	if h["node"] == "" {
		return nil, nil
	}
	b := &binding{node: h["node"]}
	if v := h["at"]; v != "" {
		if b.at, err = strconv.ParseInt(v, 10, 64); err != nil {
			return nil, fmt.Errorf("decode binding of %s: %w", id, err)
		}
	}
	if v := h["lost"]; v != "" {
		if b.lost, err = strconv.ParseInt(v, 10, 64); err != nil {
			return nil, fmt.Errorf("decode binding of %s: %w", id, err)
		}
	}
	return b, nil
}

func isNil(err error) bool { return errors.Is(err, redis.Nil) }

func zmember(score int64, id string) redis.Z { return redis.Z{Score: float64(score), Member: id} }

// reserve counts a placement against the node until Bind takes it or it
// expires, so a burst of creates spreads; it returns the reservation's
// name.
func (s *Scheduler) reserve(ctx context.Context, node string, res *pb.Resources) (string, error) {
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	now := s.now().UnixMilli()
	member := fmt.Sprintf("%s:%d:%d", hex.EncodeToString(nonce[:]), res.GetCpuCount(), res.GetMemoryMb())
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.ZRemRangeByScore(ctx, s.k.resv(node), "-inf", strconv.FormatInt(now, 10))
		p.ZAdd(ctx, s.k.resv(node), redis.Z{Score: float64(now + s.opts.ReserveTTL.Milliseconds()), Member: member})
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("reserve on node %s: %w", node, err)
	}
	return member, nil
}

// unreserve gives a reservation back (gone already: nothing to do).
func (s *Scheduler) unreserve(ctx context.Context, node, reservation string) error {
	if err := s.rdb.ZRem(ctx, s.k.resv(node), reservation).Err(); err != nil {
		return fmt.Errorf("unreserve on node %s: %w", node, err)
	}
	return nil
}

// addReservations sums reservation members ("nonce:cpu:mem"); a damaged
// one counts as a sandbox without resources.
func (r *nodeRecord) addReservations(members []string) {
	for _, m := range members {
		r.pendingN++
		parts := strings.Split(m, ":")
		if len(parts) != 3 {
			continue
		}
		cpu, err1 := strconv.ParseInt(parts[1], 10, 32)
		mem, err2 := strconv.ParseInt(parts[2], 10, 64)
		if err1 == nil && err2 == nil && cpu >= 0 && mem >= 0 {
			r.pendingCPU += cpu
			r.pendingMem += mem
		}
	}
}
