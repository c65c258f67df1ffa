// Command aenv-gateway is the cluster's one HTTP endpoint: the E2B API and
// the sandbox proxy in front of the aenvd nodes an aenv-scheduler knows.
//
//	aenv-gateway --listen :3000 --schedulers 10.0.0.5:7070,10.0.0.6:7070 --domain sbx.example.com
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/agentenv/agentenv/cluster/gateway"
	"github.com/agentenv/agentenv/dashboard"
	"github.com/agentenv/agentenv/internal/daemon"
	"github.com/agentenv/agentenv/internal/version"
	"github.com/agentenv/agentenv/proxy"
)

type flags struct {
	listen, schedulers, domain string
	k8sService, k8sPort        string
	kubeconfig                 string
	lookupTTL                  time.Duration
	connsPerClient             int
}

func (f *flags) define(fs *flag.FlagSet) {
	fs.StringVar(&f.listen, "listen", daemon.EnvOr("AENV_GATEWAY_LISTEN", "127.0.0.1:3000"), "HTTP listen address")
	fs.StringVar(&f.schedulers, "schedulers", daemon.EnvOr("AENV_GATEWAY_SCHEDULERS", daemon.EnvOr("AENV_GATEWAY_SCHEDULER", "127.0.0.1:7070")), "aenv-scheduler gRPC addresses, comma-separated")
	fs.StringVar(&f.domain, "domain", daemon.EnvOr("AENV_GATEWAY_DOMAIN", ""), "sandbox host domain ({port}-{id}.{domain}); the nodes' api.domain")
	fs.StringVar(&f.k8sService, "schedulers-service", daemon.EnvOr("AENV_GATEWAY_SCHEDULERS_SERVICE", ""), "find the schedulers as the ready endpoints of this Kubernetes Service (namespace/name) instead of --schedulers")
	fs.StringVar(&f.k8sPort, "schedulers-port", daemon.EnvOr("AENV_GATEWAY_SCHEDULERS_PORT", ""), "the Service's port name for --schedulers-service (default: its first port)")
	fs.StringVar(&f.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig for --schedulers-service (default: the in-cluster service account)")
	fs.IntVar(&f.connsPerClient, "conns-per-client", 512, "concurrent connections one client address may hold (slow clients cannot tie up the gateway)")
	fs.DurationVar(&f.lookupTTL, "lookup-ttl", 2*time.Second, "how long a sandbox's node is remembered between scheduler lookups (a node answering that it does not hold the sandbox drops it at once)")
}

func main() {
	var f flags
	daemon.Main("aenv-gateway", f.define, func(ctx context.Context, log *slog.Logger) error { return run(ctx, f, log) })
}

func run(ctx context.Context, f flags, log *slog.Logger) error {
	conn, stopDiscovery, err := dialSchedulers(ctx, f, log)
	if err != nil {
		return err
	}
	defer conn.Close()
	defer stopDiscovery()
	g := gateway.New(gateway.Options{Scheduler: conn.Client(), Domain: f.domain, LookupTTL: f.lookupTTL, Logger: log})
	ln, err := listen(f.listen, f.connsPerClient)
	if err != nil {
		return err
	}
	// No read or write timeout: command streams and file transfers last
	// as long as they need; slow clients are bounded by the connections
	// each address may hold, as on the nodes.
	srv := &http.Server{Handler: dashboard.Mount(g, g.SandboxTraffic), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("aenv-gateway ready", "listen", ln.Addr().String(), "schedulers", f.schedulers, "domain", f.domain, "version", version.Version())
	select {
	case <-ctx.Done():
	case err = <-errc:
		return fmt.Errorf("http server: %w", err)
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	log.Info("aenv-gateway stopped")
	return nil
}

// listen opens the gateway's listener, limited to perClient concurrent
// connections per client address.
func listen(addr string, perClient int) (net.Listener, error) {
	if perClient < 1 {
		return nil, fmt.Errorf("--conns-per-client %d: at least 1", perClient)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	return proxy.LimitPerClient(ln, perClient), nil
}
