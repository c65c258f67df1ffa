package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// maxIDLen bounds a sandbox id taken from a request (the nodes' ids are
// short letters and digits).
const maxIDLen = 64

func validID(id string) bool {
	if id == "" || len(id) > maxIDLen {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// SandboxTraffic reports whether r is meant for a sandbox's proxy (by the
// E2b-Sandbox-Id header or the host {port}-{id}.{domain}).
func (g *Gateway) SandboxTraffic(r *http.Request) bool {
	_, ok := g.sandboxOfProxy(r)
	return ok
}

// sandboxOfProxy finds the sandbox a proxied request names: the id header,
// or the host {port}-{id}.{domain}.
func (g *Gateway) sandboxOfProxy(r *http.Request) (string, bool) {
	if id := r.Header.Get("E2b-Sandbox-Id"); id != "" {
		return id, true
	}
	if g.opts.Domain == "" {
		return "", false
	}
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, ok := strings.CutSuffix(host, "."+g.opts.Domain)
	if !ok {
		return "", false
	}
	port, id, ok := strings.Cut(label, "-")
	if !ok {
		return "", false
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", false
	}
	return id, true
}

// sandboxOfPath is the id in /sandboxes/{id}[/...] or /v2/sandboxes/{id}/...
func sandboxOfPath(p string) string {
	rest, ok := strings.CutPrefix(p, "/v2")
	if !ok {
		rest = p
	}
	rest = strings.TrimPrefix(rest, "/sandboxes/")
	id, _, _ := strings.Cut(rest, "/")
	return id
}

// errNodeDown is a sandbox whose node is down or gone.
type errNodeDown struct{ node string }

func (e errNodeDown) Error() string { return "the node " + e.node + " holding this sandbox is down" }

// nodeOf asks the scheduler (or the short cache) which node holds id.
func (g *Gateway) nodeOf(ctx context.Context, id string) (*url.URL, error) {
	g.mu.Lock()
	c, ok := g.cache[id]
	g.mu.Unlock()
	if ok && time.Since(c.at) < g.opts.LookupTTL {
		return c.url, nil
	}
	r, err := g.lookup(ctx, id)
	if err != nil {
		return nil, err
	}
	if r.GetLost() || r.GetNode().GetState() != pb.NodeState_NODE_STATE_UP {
		return nil, errNodeDown{r.GetNode().GetStatus().GetName()}
	}
	u, err := url.Parse(r.GetNode().GetStatus().GetApiUrl())
	if err != nil {
		return nil, fmt.Errorf("node %s api url: %w", r.GetNode().GetStatus().GetName(), err)
	}
	g.remember(id, u)
	return u, nil
}

// lookup retries once: a call in flight to a scheduler replica that died
// fails, the next goes to a live one.
func (g *Gateway) lookup(ctx context.Context, id string) (*pb.LookupNodeResponse, error) {
	r, err := g.sched.LookupNode(ctx, &pb.LookupNodeRequest{SandboxId: id})
	if status.Code(err) == codes.Unavailable {
		r, err = g.sched.LookupNode(ctx, &pb.LookupNodeRequest{SandboxId: id})
	}
	return r, err
}

func (g *Gateway) remember(id string, u *url.URL) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.cache) > 100000 { // bounded: drop all, refill on demand
		clear(g.cache)
	}
	g.cache[id] = cached{url: u, at: time.Now()}
}

func (g *Gateway) forget(id string) {
	g.mu.Lock()
	delete(g.cache, id)
	g.mu.Unlock()
}

// failLookup answers a failed lookup.
func (g *Gateway) failLookup(w http.ResponseWriter, id string, err error) {
	switch e := err.(type) {
	case errNodeDown:
		writeError(w, http.StatusBadGateway, fmt.Sprintf("sandbox %s: %v", id, e))
		return
	}
	switch status.Code(err) {
	case codes.NotFound:
		writeError(w, http.StatusNotFound, "sandbox "+id+" not found")
	case codes.InvalidArgument:
		writeError(w, http.StatusBadRequest, status.Convert(err).Message())
	default:
		g.log.Warn("scheduler lookup failed", "sandbox", id, "err", err)
		writeError(w, http.StatusServiceUnavailable, "scheduler unavailable: "+status.Convert(err).Message())
	}
}

// toSandboxNode forwards a request to the node holding id.
func (g *Gateway) toSandboxNode(w http.ResponseWriter, r *http.Request, id string) {
	if u, ok := g.locate(w, r, id); ok {
		g.forward(w, r, u, id, false)
	}
}

// locate finds the node of sandbox id, answering the request itself (bad
// id, unknown sandbox, scheduler down) when it cannot.
func (g *Gateway) locate(w http.ResponseWriter, r *http.Request, id string) (*url.URL, bool) {
	if !validID(id) {
		writeError(w, http.StatusBadRequest, "invalid sandbox id")
		return nil, false
	}
	u, err := g.nodeOf(r.Context(), id)
	if err != nil {
		g.failLookup(w, id, err)
		return nil, false
	}
	return u, true
}

// route is where forward sends one request: the node, and the sandbox the
// request is about ("" for calls that name none).
type route struct {
	node *url.URL
	id   string
	// api: a call of the node's API on the sandbox, whose 404 means the
	// node does not hold it (a guest's own 404 on proxied traffic does not)
	api bool
	// replay: the request can be sent again (no body, a safe method)
	replay bool
	// movedTo is the sandbox's node after the first answered that it does
	// not hold it; forward sends the request there
	movedTo *url.URL
}

// forward proxies r to the node at u. When that node answers it does not
// hold sandbox id (the cached binding was stale: the sandbox was resumed
// elsewhere or killed through another gateway) the binding is forgotten,
// and a request that can be replayed goes once to the node the scheduler
// names now.
func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, u *url.URL, id string, api bool) {
	rt := &route{node: u, id: id, api: api, replay: replayable(r)}
	g.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), routeKey{}, rt)))
	if rt.movedTo != nil {
		again := &route{node: rt.movedTo, id: id, api: api}
		g.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), routeKey{}, again)))
	}
}

// replayable is a request forward may send twice: a safe method without a
// body (a WebSocket upgrade is one; nothing reached the guest on a 502).
func replayable(r *http.Request) bool {
	safe := r.Method == http.MethodGet || r.Method == http.MethodHead || r.Method == http.MethodOptions
	return safe && (r.Body == nil || r.Body == http.NoBody)
}

// errMoved tells proxyError the node's answer was dropped for a replay.
var errMoved = errors.New("sandbox moved to another node")

// moved is the reverse proxy's ModifyResponse: it recognises a node's
// answer that it does not hold the sandbox (its proxy's 502, its API's
// 404), forgets the binding, and asks for a replay when the scheduler now
// names another node. Otherwise the node's answer goes to the client.
func (g *Gateway) moved(resp *http.Response) error {
	rt, _ := resp.Request.Context().Value(routeKey{}).(*route)
	if rt == nil || rt.id == "" {
		return nil
	}
	notHere := resp.StatusCode == http.StatusBadGateway || rt.api && resp.StatusCode == http.StatusNotFound
	if !notHere {
		return nil
	}
	g.forget(rt.id)
	if !rt.replay {
		return nil
	}
	u, err := g.nodeOf(resp.Request.Context(), rt.id)
	if err != nil || u.String() == rt.node.String() {
		return nil // the scheduler agrees, or cannot say: the node's answer stands
	}
	g.log.Info("sandbox moved; replaying on its node", "sandbox", rt.id, "from", rt.node.Host, "to", u.Host)
	rt.movedTo = u
	return errMoved
}

// proxyError answers a node that could not be reached (and forgets the
// binding that led there), or stays silent for a replay forward makes.
func (g *Gateway) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, errMoved) {
		return
	}
	if rt, _ := r.Context().Value(routeKey{}).(*route); rt != nil && rt.id != "" {
		g.forget(rt.id)
	}
	g.log.Warn("node unreachable", "path", r.URL.Path, "err", err)
	writeError(w, http.StatusBadGateway, "node unreachable: "+err.Error())
}

// sandboxCall routes /sandboxes/{id}/... to the sandbox's node, unbinding
// after a successful kill, binding fork children, and placing the resume of
// a down node's sandbox on a live node.
func (g *Gateway) sandboxCall(w http.ResponseWriter, r *http.Request) {
	id := sandboxOfPath(r.URL.Path)
	if validID(id) && isResume(r, id) {
		g.resume(w, r, id)
		return
	}
	u, ok := g.locate(w, r, id)
	if !ok {
		return
	}
	if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/fork") {
		g.fork(w, r, u, id)
		return
	}
	rw := &statusWriter{ResponseWriter: w}
	g.forward(rw, r, u, id, true)
	if r.Method == http.MethodDelete && r.URL.Path == "/sandboxes/"+id && rw.status/100 == 2 {
		g.forget(id)
		if _, err := g.sched.Unbind(context.WithoutCancel(r.Context()), &pb.UnbindRequest{SandboxId: id}); err != nil {
			g.log.Warn("unbind a killed sandbox", "sandbox", id, "err", err)
		}
	}
}

// statusWriter records the status a handler wrote, keeping the flusher
// and hijacker of the writer it wraps (streams and WebSockets).
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach Flush and Hijack.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

func (s *statusWriter) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
