// Package gateway is the cluster's one HTTP endpoint: the E2B-compatible API
// and the sandbox proxy in front of many aenvd nodes. Creates are placed by
// the scheduler (and retried on another node when one refuses for
// capacity); calls on a sandbox go to the node the scheduler binds it to
// (the id from the path, the E2b-Sandbox-Id header or the host
// {port}-{id}.{domain}); lists are gathered from every live node. Requests
// and responses stream through unchanged (flushing at once; WebSocket
// upgrades pass), credentials included: the nodes authenticate.
package gateway

import (
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"time"

	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
)

// Options configures a gateway.
type Options struct {
	// Scheduler answers placement and lookups; required.
	Scheduler pb.SchedulerClient
	// Domain is the sandbox host suffix ({port}-{id}.{domain}); the nodes
	// must be configured with the same. Empty disables host routing.
	Domain string
	// Transport reaches the nodes (default: a pooled http.Transport).
	Transport http.RoundTripper
	// LookupTTL is how long a sandbox's node is remembered without asking
	// the scheduler again (default 2s). A node answering that it does not
	// hold the sandbox (a 502, or a 404 to an API call on it) forgets it at
	// once, and a request without a body is sent again to the node the
	// scheduler names now (route.go, moved).
	LookupTTL time.Duration
	// MaxCreateAttempts bounds the nodes one create tries (default 3).
	MaxCreateAttempts int
	Logger            *slog.Logger
}

// Gateway is an http.Handler.
type Gateway struct {
	opts  Options
	sched pb.SchedulerClient
	tr    http.RoundTripper
	rp    *httputil.ReverseProxy
	log   *slog.Logger

	mu    sync.Mutex
	cache map[string]cached

	resuming keyLocks
}

type cached struct {
	url *url.URL
	at  time.Time
}

// routeKey carries a proxied request's *route from forward to Rewrite,
// ModifyResponse and ErrorHandler.
type routeKey struct{}

// New builds a gateway.
func New(opts Options) *Gateway {
	if opts.Transport == nil {
		opts.Transport = &http.Transport{
			Proxy:               nil,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        1024,
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     90 * time.Second,
			// The client's Accept-Encoding goes through as it is: left
			// on, a request without one would be asked gzipped of the node
			// and inflated here (CPU on both, and the answer's length lost).
			DisableCompression: true,
		}
	}
	if opts.LookupTTL <= 0 {
		opts.LookupTTL = 2 * time.Second
	}
	if opts.MaxCreateAttempts <= 0 {
		opts.MaxCreateAttempts = 3
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	g := &Gateway{opts: opts, sched: opts.Scheduler, tr: opts.Transport, log: opts.Logger.With("component", "gateway"),
		cache: map[string]cached{}}
	g.rp = &httputil.ReverseProxy{
		Transport:     opts.Transport,
		FlushInterval: -1,
		BufferPool:    bufferPool{},
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(pr.In.Context().Value(routeKey{}).(*route).node)
			pr.Out.Host = pr.In.Host // the node's proxy routes by host too
			pr.SetXForwarded()
		},
		ModifyResponse: g.moved,
		ErrorHandler:   g.proxyError,
	}
	return g
}

// ServeHTTP routes one request.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if id, ok := g.sandboxOfProxy(r); ok {
		g.toSandboxNode(w, r, id)
		return
	}
	p := r.URL.Path
	switch {
	case p == "/health":
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	case p == "/sandboxes" || p == "/v2/sandboxes":
		if r.Method == http.MethodPost {
			g.create(w, r)
		} else if p == "/sandboxes" {
			g.listAll(w, r)
		} else {
			g.listPaged(w, r)
		}
	case p == "/sandboxes-compose" && r.Method == http.MethodPost:
		g.create(w, r) // placed and bound like a create; the node checks the file
	case strings.HasPrefix(p, "/sandboxes/") || strings.HasPrefix(p, "/v2/sandboxes/"):
		g.sandboxCall(w, r)
	case p == "/nodes":
		g.nodes(w, r)
	case strings.HasPrefix(p, "/nodes/"):
		g.node(w, r)
	case p == "/snapshots" && r.Method == http.MethodGet:
		g.listSnapshots(w, r)
	case p == "/snapshots" || p == "/templates" || p == "/v2/templates":
		g.concat(w, r)
	case strings.HasPrefix(p, "/snapshots/") || strings.HasPrefix(p, "/templates/") || strings.HasPrefix(p, "/v2/templates/"):
		g.firstFound(w, r)
	case p == "/v3/templates":
		g.firstFound(w, r)
	case isEvents(p):
		g.sandboxEvents(w, r)
	case p == "/events/webhooks" || strings.HasPrefix(p, "/events/webhooks/"):
		g.webhooks(w, r)
	case p == "/volumes" && r.Method == http.MethodPost:
		g.volumeCreate(w, r)
	case p == "/volumes":
		g.listAll(w, r)
	case strings.HasPrefix(p, "/volumes/"):
		g.firstFound(w, r)
	default:
		writeError(w, http.StatusNotFound, "no route for "+p)
	}
}

// apiError is the nodes' error body.
type apiError struct {
	Code    int32  `json:"code"`
	Message string `json:"message"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, apiError{Code: int32(status), Message: msg})
}

// bufferPool lends the reverse proxy 256 KiB copy buffers (its default
// 32 KiB costs a write per 32 KiB on large file transfers).
type bufferPool struct{}

var buffers = sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}

func (bufferPool) Get() []byte  { return *buffers.Get().(*[]byte) }
func (bufferPool) Put(b []byte) { buffers.Put(&b) }
