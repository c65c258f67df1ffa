// Command aenv-scheduler is one replica of the cluster scheduler: the gRPC
// API of cluster/schedulerpb over state in Redis. Run two or more against
// the same Redis; any one answers, one at a time reconciles.
//
//	aenv-scheduler --listen :7070 --redis redis://127.0.0.1:6379/0
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/agentenv/agentenv/cluster/scheduler"
	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
	"github.com/agentenv/agentenv/internal/version"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
)

type flags struct {
	listen, redisURL, prefix, policy, replica string
	heartbeat, downAfter, lease               time.Duration
}

func parseFlags(args []string) (flags, error) {
	var f flags
	fs := flag.NewFlagSet("aenv-scheduler", flag.ContinueOnError)
	fs.StringVar(&f.listen, "listen", envOr("AENV_SCHEDULER_LISTEN", "127.0.0.1:7070"), "gRPC listen address")
	fs.StringVar(&f.redisURL, "redis", envOr("AENV_SCHEDULER_REDIS", "redis://127.0.0.1:6379/0"), "Redis URL (redis://[user:pass@]host:port/db)")
	fs.StringVar(&f.prefix, "prefix", envOr("AENV_SCHEDULER_PREFIX", "aenv:"), "prefix of every Redis key")
	fs.StringVar(&f.policy, "policy", envOr("AENV_SCHEDULER_POLICY", "least-loaded"), "placement: least-loaded, round-robin or random")
	fs.StringVar(&f.replica, "replica-id", os.Getenv("AENV_SCHEDULER_REPLICA_ID"), "this replica's name in the lease (default host-pid)")
	fs.DurationVar(&f.heartbeat, "heartbeat-interval", 2*time.Second, "how often nodes heartbeat")
	fs.DurationVar(&f.downAfter, "down-after", 10*time.Second, "a node silent this long is marked down")
	fs.DurationVar(&f.lease, "lease-ttl", 5*time.Second, "lifetime of the reconciliation lease")
	printVersion := fs.Bool("version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return f, err
	}
	if *printVersion {
		fmt.Println("aenv-scheduler", version.Get())
		os.Exit(0)
	}
	return f, nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func main() {
	f, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	slog.SetDefault(log)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, f, log); err != nil {
		log.Error("aenv-scheduler failed", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, f flags, log *slog.Logger) error {
	ropts, err := redis.ParseURL(f.redisURL)
	if err != nil {
		return fmt.Errorf("redis url: %w", err)
	}
	rdb := redis.NewClient(ropts)
	defer rdb.Close()
	s, err := scheduler.New(scheduler.Options{Redis: rdb, Prefix: f.prefix, ReplicaID: f.replica, Policy: scheduler.Policy(f.policy),
		HeartbeatInterval: f.heartbeat, DownAfter: f.downAfter, LeaseTTL: f.lease, Logger: log})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", f.listen, err)
	}
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(8 << 20))
	pb.RegisterSchedulerServer(srv, s)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	rctx, cancel := context.WithCancel(ctx)
	runDone := make(chan struct{})
	go func() { defer close(runDone); _ = s.Run(rctx) }()
	log.Info("aenv-scheduler ready", "listen", ln.Addr().String(), "policy", f.policy, "version", version.Version())
	select {
	case <-ctx.Done():
	case err = <-errc:
		log.Error("grpc server", "err", err)
	}
	cancel()
	<-runDone // resigns the lease
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		srv.Stop()
	}
	log.Info("aenv-scheduler stopped")
	return err
}
