// Command aenv-scheduler is one replica of the cluster scheduler: the gRPC
// API of cluster/schedulerpb over state in Redis. Run two or more against
// the same Redis; any one answers, one at a time reconciles.
//
//	aenv-scheduler --listen :7070 --redis redis://127.0.0.1:6379/0
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/agentenv/agentenv/cluster/discovery"
	"github.com/agentenv/agentenv/cluster/scheduler"
	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
	"github.com/agentenv/agentenv/internal/daemon"
	"github.com/agentenv/agentenv/internal/version"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"k8s.io/client-go/kubernetes"
)

type flags struct {
	listen, redisURL, prefix, policy, replica string
	discovery, nodes, nodeService, nodePort   string
	kubeconfig                                string
	heartbeat, downAfter, lease               time.Duration
}

func (f *flags) define(fs *flag.FlagSet) {
	fs.StringVar(&f.listen, "listen", daemon.EnvOr("AENV_SCHEDULER_LISTEN", "127.0.0.1:7070"), "gRPC listen address")
	fs.StringVar(&f.redisURL, "redis", daemon.EnvOr("AENV_SCHEDULER_REDIS", "redis://127.0.0.1:6379/0"), "Redis URL (redis://[user:pass@]host:port/db)")
	fs.StringVar(&f.prefix, "prefix", daemon.EnvOr("AENV_SCHEDULER_PREFIX", "aenv:"), "prefix of every Redis key")
	fs.StringVar(&f.policy, "policy", daemon.EnvOr("AENV_SCHEDULER_POLICY", "least-loaded"), "placement: least-loaded, round-robin or random")
	fs.StringVar(&f.replica, "replica-id", daemon.EnvOr("AENV_SCHEDULER_REPLICA_ID", os.Getenv("POD_NAME")), "this replica's name in the lease (default $POD_NAME, else host-pid)")
	fs.StringVar(&f.discovery, "discovery", daemon.EnvOr("AENV_SCHEDULER_DISCOVERY", ""), "how nodes are expected: \"\" (they register), static (--nodes) or kubernetes (--node-service); an expected node that has not registered is listed as down")
	fs.StringVar(&f.nodes, "nodes", daemon.EnvOr("AENV_SCHEDULER_NODES", ""), "static discovery: the nodes' API addresses (host:port), comma-separated")
	fs.StringVar(&f.nodeService, "node-service", daemon.EnvOr("AENV_SCHEDULER_NODE_SERVICE", ""), "kubernetes discovery: the nodes' headless Service (namespace/name)")
	fs.StringVar(&f.nodePort, "node-port", daemon.EnvOr("AENV_SCHEDULER_NODE_PORT", "api"), "kubernetes discovery: the Service's port name of the node API")
	fs.StringVar(&f.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubernetes discovery: a kubeconfig (default: the in-cluster service account)")
	fs.DurationVar(&f.heartbeat, "heartbeat-interval", 2*time.Second, "how often nodes heartbeat")
	fs.DurationVar(&f.downAfter, "down-after", 10*time.Second, "a node silent this long is marked down")
	fs.DurationVar(&f.lease, "lease-ttl", 5*time.Second, "lifetime of the reconciliation lease")
}

func main() {
	var f flags
	daemon.Main("aenv-scheduler", f.define, func(ctx context.Context, log *slog.Logger) error { return run(ctx, f, log) })
}

func run(ctx context.Context, f flags, log *slog.Logger) error {
	if !strings.Contains(f.redisURL, "://") {
		f.redisURL = "redis://" + f.redisURL // host:port
	}
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
	src, err := nodeSource(f, log)
	if err != nil {
		srv.Stop()
		return err
	}
	rctx, cancel := context.WithCancel(ctx)
	runDone := make(chan struct{})
	go func() { defer close(runDone); _ = s.Run(rctx) }()
	discDone := make(chan struct{})
	go func() {
		defer close(discDone)
		if src == nil {
			return
		}
		if err := src.Run(rctx, s.SetDiscovered); err != nil {
			log.Error("node discovery", "err", err)
		}
	}()
	log.Info("aenv-scheduler ready", "listen", ln.Addr().String(), "policy", f.policy, "version", version.Version())
	select {
	case <-ctx.Done():
	case err = <-errc:
		log.Error("grpc server", "err", err)
	}
	cancel()
	<-runDone // resigns the lease
	<-discDone
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

// nodeSource is the configured node discovery (nil: none).
func nodeSource(f flags, log *slog.Logger) (discovery.Source, error) {
	switch f.discovery {
	case "":
		return nil, nil
	case "static":
		return discovery.Static(daemon.SplitList(f.nodes)), nil
	case "kubernetes":
		ns, name, err := discovery.ParseService(f.nodeService)
		if err != nil {
			return nil, fmt.Errorf("--node-service: %w", err)
		}
		cfg, err := discovery.RESTConfig(f.kubeconfig)
		if err != nil {
			return nil, err
		}
		c, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return nil, fmt.Errorf("kubernetes client: %w", err)
		}
		return &discovery.Kubernetes{Client: c, Namespace: ns, Service: name, Port: f.nodePort, Logger: log}, nil
	}
	return nil, fmt.Errorf("--discovery %q: want static or kubernetes", f.discovery)
}
