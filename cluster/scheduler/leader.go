package scheduler

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// The reconciliation lease: one replica at a time marks silent nodes down
// and reconciles rosters. The lease is a Redis key holding "<epoch>:<replica>"
// with a TTL; every write the leader makes runs in a script that first checks
// the key still holds its token, so a replica that lost the lease (paused,
// partitioned, its TTL expired) cannot write: the token is its fence.

// acquireScript takes the lease when free, or renews it when the caller
// holds it. KEYS: leader, epoch. ARGV: replica id, current token ("" when
// none), ttl ms. Returns the token held, or nil.
var acquireScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur then
  if ARGV[2] ~= '' and cur == ARGV[2] then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return cur
  end
  return false
end
local e = redis.call('INCR', KEYS[2])
local tok = e .. ':' .. ARGV[1]
redis.call('SET', KEYS[1], tok, 'PX', ARGV[3])
return tok`)

// releaseScript gives the lease up if held. KEYS: leader. ARGV: token.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)

type lease struct {
	mu      sync.Mutex
	token   string
	renewed time.Time
}

// current is the token while the lease is believed held: renewed within
// the TTL. Writes are fenced by Redis anyway; this keeps a replica that
// cannot reach Redis from acting as leader on stale belief.
func (s *Scheduler) current() string {
	s.lease.mu.Lock()
	defer s.lease.mu.Unlock()
	if s.lease.token == "" || s.now().Sub(s.lease.renewed) >= s.opts.LeaseTTL {
		return ""
	}
	return s.lease.token
}

// IsLeader reports whether this replica holds the reconciliation lease.
func (s *Scheduler) IsLeader() bool { return s.current() != "" }

// campaign takes or renews the lease once.
func (s *Scheduler) campaign(ctx context.Context) error {
	s.lease.mu.Lock()
	tok := s.lease.token
	s.lease.mu.Unlock()
	start := s.now()
	v, err := acquireScript.Run(ctx, s.rdb, []string{s.k.leader(), s.k.epoch()},
		s.opts.ReplicaID, tok, s.opts.LeaseTTL.Milliseconds()).Text()
	s.lease.mu.Lock()
	defer s.lease.mu.Unlock()
	switch {
	case err == redis.Nil:
		if s.lease.token != "" {
			s.log.Warn("lost the reconciliation lease", "token", s.lease.token)
		}
		s.lease.token = ""
		return nil
	case err != nil:
		return fmt.Errorf("campaign for the lease: %w", err)
	}
	if v != s.lease.token {
		s.log.Info("holding the reconciliation lease", "token", v)
	}
	s.lease.token, s.lease.renewed = v, start
	return nil
}

// resign releases the lease on shutdown, so the other replica takes over
// without waiting for the TTL.
func (s *Scheduler) resign(ctx context.Context) {
	tok := s.current()
	if tok == "" {
		return
	}
	if err := releaseScript.Run(ctx, s.rdb, []string{s.k.leader()}, tok).Err(); err != nil {
		s.log.Warn("release the reconciliation lease", "err", err)
	}
	s.lease.mu.Lock()
	s.lease.token = ""
	s.lease.mu.Unlock()
}
