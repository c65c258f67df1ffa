// Package scheduler owns the cluster's control state: the node registry fed
// by heartbeats, placement of creates, sandbox-to-node bindings and drain
// flags, all kept in Redis so that any replica answers and a restart loses
// nothing. One replica at a time (a Redis lease with a fencing token) marks
// silent nodes down, reports their bindings lost, and reconciles bindings
// with the rosters nodes report. It serves the gRPC API of
// cluster/schedulerpb.
package scheduler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
	"github.com/redis/go-redis/v9"
)

// Options configures a scheduler replica.
type Options struct {
	// Redis holds the state; required.
	Redis redis.UniversalClient
	// Prefix is prepended to every key (default "aenv:").
	Prefix string
	// ReplicaID names this replica in the lease (default host-pid).
	ReplicaID string
	// Policy is the placement policy (default least-loaded).
	Policy Policy
	// HeartbeatInterval is told to nodes (default 2s).
	HeartbeatInterval time.Duration
	// DownAfter is how long a silent node stays up (default 5 heartbeats).
	DownAfter time.Duration
	// LeaseTTL is the reconciliation lease's lifetime (default 5s); the
	// leader renews it every third of it.
	LeaseTTL time.Duration
	// ReconcileInterval is the leader's pass period (default 1s).
	ReconcileInterval time.Duration
	// ReserveTTL is how long a placement counts against its node unless
	// Bind takes it first (default 1m: longer than a create).
	ReserveTTL time.Duration
	// RosterGrace protects fresh bindings from a roster that predates them
	// (default 2 heartbeats).
	RosterGrace time.Duration
	Logger      *slog.Logger
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

// Scheduler is one replica. Its gRPC methods serve from Redis; Run holds
// the campaign and the leader's reconciliation loop.
type Scheduler struct {
	pb.UnimplementedSchedulerServer
	opts  Options
	rdb   redis.UniversalClient
	k     keys
	log   *slog.Logger
	lease lease
	disc  discovered
}

// New checks the options and fills defaults.
func New(opts Options) (*Scheduler, error) {
	if opts.Redis == nil {
		return nil, errors.New("scheduler: no Redis client")
	}
	if opts.Prefix == "" {
		opts.Prefix = "aenv:"
	}
	if opts.ReplicaID == "" {
		h, _ := os.Hostname()
		opts.ReplicaID = fmt.Sprintf("%s-%d", h, os.Getpid())
	}
	p, err := ParsePolicy(string(opts.Policy))
	if err != nil {
		return nil, err
	}
	opts.Policy = p
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&opts.HeartbeatInterval, 2*time.Second)
	def(&opts.DownAfter, 5*opts.HeartbeatInterval)
	def(&opts.LeaseTTL, 5*time.Second)
	def(&opts.ReconcileInterval, time.Second)
	def(&opts.RosterGrace, 2*opts.HeartbeatInterval)
	def(&opts.ReserveTTL, time.Minute)
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Scheduler{opts: opts, rdb: opts.Redis, k: keys{opts.Prefix}, log: opts.Logger.With("replica", opts.ReplicaID)}, nil
}

func (s *Scheduler) now() time.Time { return s.opts.Now() }

// Run campaigns for the lease and, while holding it, reconciles, until ctx
// ends; then it resigns the lease. Redis errors are logged and retried on
// the next tick (Redis may be restarting).
func (s *Scheduler) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.loop(ctx, s.opts.LeaseTTL/3, func(ctx context.Context) error { return s.campaign(ctx) })
	}()
	s.loop(ctx, s.opts.ReconcileInterval, s.reconcile)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	wg.Wait()
	s.resign(rctx)
	return nil
}

func (s *Scheduler) loop(ctx context.Context, every time.Duration, f func(context.Context) error) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if err := f(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("scheduler pass failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ReconcileOnce campaigns and, when leader, runs one reconciliation pass
// (tests and tools; Run does this continuously).
func (s *Scheduler) ReconcileOnce(ctx context.Context) error {
	if err := s.campaign(ctx); err != nil {
		return err
	}
	return s.reconcile(ctx)
}
