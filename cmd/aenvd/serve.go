package main

import (
	"context"
	"errors"
	"fmt"
	"github.com/agentenv/agentenv/composeup"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/agentenv/agentenv/api"
	"github.com/agentenv/agentenv/api/eventlog"
	"github.com/agentenv/agentenv/api/metricsring"
	"github.com/agentenv/agentenv/api/webhooks"
	"github.com/agentenv/agentenv/config"
	"github.com/agentenv/agentenv/dashboard"
	"github.com/agentenv/agentenv/internal/version"
	"github.com/agentenv/agentenv/orchestrator"
	"github.com/agentenv/agentenv/proxy"
	"github.com/agentenv/agentenv/store"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// node is what run built and serve puts behind the API and the proxy.
type node struct {
	orch     *orchestrator.Orchestrator
	store    *store.Store
	repo     *repoNode
	key      string
	registry *prometheus.Registry
	backend  backend
	compose  *composeup.Starter // POST /sandboxes-compose
}

// serve answers the node's API and sandbox proxy until ctx ends or a
// server fails, then leaves the cluster, stops the servers and shuts the
// orchestrator down (pausing running sandboxes when configured to).
func serve(ctx context.Context, cfg config.Config, n node, log *slog.Logger) error {
	px := proxy.New(proxySandboxes{n.orch}, cfg.API.Domain, log)
	px.APIKey = n.key // stripped from anything forwarded to a guest
	// A sandbox's end (kill, pause) closes its streams through the proxy.
	defer n.orch.Subscribe(proxyEvents(px))()
	// The sandbox metrics history, answered by range.
	history := metricsring.New(n.orch, 0, 0, log)
	history.Start(ctx)
	defer history.Close()
	hooks, err := webhooks.New(n.store, webhooks.Options{Logger: log}) // lifecycle webhooks, their pending deliveries resumed
	if err != nil {
		return err
	}
	hooks.Start(ctx)
	defer hooks.Close()
	defer n.orch.Subscribe(hooks.OnEvent)()
	events := eventlog.New(eventlog.Limits{}) // the recent lifecycle events, for /events/sandboxes
	defer n.orch.Subscribe(events.OnEvent)()
	hostname, _ := os.Hostname()
	if cfg.Cluster.NodeName != "" {
		hostname = cfg.Cluster.NodeName // one name in /nodes and in the cluster
	}
	handler := api.NewHandler(api.Options{
		Orchestrator: n.orch, APIKey: n.key, Domain: cfg.API.Domain, Proxy: px, Logger: log, Store: n.store, StateDir: cfg.DataDir,
		Node: api.NodeInfo{ID: hostname, Version: version.Version(), Commit: version.Get().Commit, Date: version.Get().Date,
			VMMDriver: n.backend.driver.Name(), VMMAccel: n.backend.accel, VMMReasons: n.backend.why},
		DefaultTimeout: cfg.Sandbox.DefaultTimeout.Duration, MaxTimeout: cfg.Sandbox.MaxTimeout.Duration,
		Metrics: promhttp.HandlerFor(n.registry, promhttp.HandlerOpts{}), MetricsHistory: history, Webhooks: hooks, Events: events,
		Repository: n.repo.status(), Compose: n.compose,
	})
	handler = dashboard.Mount(handler, px.Match) // the web dashboard at /dashboard/, same origin as the API
	member, err := newClusterMember(cfg, n.orch, n.repo, n.backend.driver.Name(), n.backend.accel, hostname, log)
	if err != nil {
		return err
	}
	// Until the scheduler first answered, requests wait (but health and
	// metrics): it names the copies this node must not serve. After that,
	// a request on a sandbox is served only while the node proves it still
	// owns it (fence).
	limits := defaultServerLimits(cfg)
	servers, err := httpServers(cfg, limits, member.gate(member.fence(handler, apiSandboxOf(px), false), "/health", "/metrics"),
		member.gate(member.fence(px, px.SandboxOf, true)))
	if err != nil {
		return err
	}
	g, err := startHTTP(servers, limits, log)
	if err != nil {
		return err
	}
	member.start(ctx, func() { n.repo.startUploads(ctx) })
	log.Info("aenvd ready", "api", cfg.API.Listen, "proxy", cfg.API.ProxyListen, "dataDir", cfg.DataDir)
	select {
	case <-ctx.Done():
	case err := <-g.failed:
		log.Error("http server", "err", err)
	}
	member.leave() // the scheduler stops placing here before the sandboxes pause
	log.Info("shutting down", "pauseRunning", cfg.Sandbox.PauseOnShutdown)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	g.shutdown(sctx)
	return n.orch.Shutdown(sctx, cfg.Sandbox.PauseOnShutdown)
}

// httpServers are the node's servers: the API, and the sandbox proxy in
// cleartext and over TLS where configured.
func httpServers(cfg config.Config, limits serverLimits, apiHandler, proxyHandler http.Handler) ([]*http.Server, error) {
	servers := []*http.Server{newHTTPServer(cfg.API.Listen, apiHandler, limits)}
	if cfg.API.ProxyListen != "" {
		servers = append(servers, newHTTPServer(cfg.API.ProxyListen, proxyHandler, limits))
	}
	if cfg.API.ProxyTLSListen != "" {
		tlsCfg, err := proxy.TLSConfig(cfg.API.Domain, cfg.API.TLSCert, cfg.API.TLSKey, filepath.Join(cfg.DataDir, "tls"))
		if err != nil {
			return nil, err
		}
		srv := newHTTPServer(cfg.API.ProxyTLSListen, proxyHandler, limits)
		srv.TLSConfig = tlsCfg
		servers = append(servers, srv)
	}
	return servers, nil
}

// httpGroup owns the goroutines serving the node's HTTP servers: failed
// receives a server's unexpected end, shutdown stops them all and waits.
type httpGroup struct {
	servers []*http.Server
	failed  chan error // buffered: one per server, never blocks a Serve goroutine
	wg      sync.WaitGroup
}

// startHTTP listens on every server's address and serves each in its own
// goroutine; if one cannot listen, those already started are shut down.
func startHTTP(servers []*http.Server, limits serverLimits, log *slog.Logger) (*httpGroup, error) {
	g := &httpGroup{failed: make(chan error, len(servers))}
	for _, srv := range servers {
		ln, err := listenHTTP(srv.Addr, limits)
		if err != nil {
			g.shutdown(context.Background())
			return nil, err
		}
		log.Info("listening", "addr", ln.Addr().String(), "tls", srv.TLSConfig != nil)
		g.servers = append(g.servers, srv)
		g.wg.Go(func() {
			var err error
			if srv.TLSConfig != nil {
				err = srv.ServeTLS(ln, "", "")
			} else {
				err = srv.Serve(ln)
			}
			if !errors.Is(err, http.ErrServerClosed) {
				g.failed <- fmt.Errorf("serve %s: %w", srv.Addr, err)
			}
		})
	}
	return g, nil
}

// shutdown stops every server (open requests get until ctx ends) and waits
// for their goroutines.
func (g *httpGroup) shutdown(ctx context.Context) {
	for _, srv := range g.servers {
		_ = srv.Shutdown(ctx)
	}
	g.wg.Wait()
}

// serverLimits are the HTTP servers' protections against slow and greedy
// clients (see newHTTPServer).
type serverLimits struct {
	readHeader, idle time.Duration
	perClient        int
	total            int // connections of all clients together (0: no limit)
}

func defaultServerLimits(cfg config.Config) serverLimits {
	return serverLimits{readHeader: 10 * time.Second, idle: 2 * time.Minute, perClient: cfg.Network.ConnsPerClient,
		total: cfg.Admission.MaxConnections}
}

// maxHeaderBytes bounds a request's header block; SDK requests carry a few
// hundred bytes.
const maxHeaderBytes = 64 << 10

// newHTTPServer builds the API's or the proxy's server. A client must send
// its request headers within readHeader and may keep an idle connection for
// idle. There is deliberately no ReadTimeout or WriteTimeout: they bound
// the whole request or response, and the proxy carries E2B command and PTY
// streams and file transfers that rightly last minutes or hours (the
// agent's own keepalives keep them busy). What a client that sends a body
// or reads a response slowly can tie up is bounded by listenHTTP's limit on
// connections per client address instead.
func newHTTPServer(addr string, h http.Handler, l serverLimits) *http.Server {
	return &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: l.readHeader, IdleTimeout: l.idle,
		MaxHeaderBytes: maxHeaderBytes}
}

// listenHTTP opens a server's listener, limited to l.perClient concurrent
// connections per client address and l.total in all.
func listenHTTP(addr string, l serverLimits) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	return proxy.LimitConnections(ln, l.perClient, l.total), nil
}
