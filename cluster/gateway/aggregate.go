package gateway

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// maxListBody bounds one node's answer to a list.
const maxListBody = 64 << 20

// liveNodes are the nodes up now, by name.
func (g *Gateway) liveNodes(ctx context.Context) ([]*pb.Node, error) {
	r, err := g.sched.ListNodes(ctx, &pb.ListNodesRequest{})
	if status.Code(err) == codes.Unavailable {
		r, err = g.sched.ListNodes(ctx, &pb.ListNodesRequest{})
	}
	if err != nil {
		return nil, err
	}
	var out []*pb.Node
	for _, n := range r.GetNodes() {
		if n.GetState() == pb.NodeState_NODE_STATE_UP {
			out = append(out, n)
		}
	}
	return out, nil
}

// answer is one node's answer to a fanned-out request.
type answer struct {
	node   *pb.Node
	status int
	header http.Header
	body   []byte
	err    error
}

// fanout sends r (a GET) with query q to every live node at once.
func (g *Gateway) fanout(w http.ResponseWriter, r *http.Request, q url.Values) ([]answer, bool) {
	nodes, err := g.liveNodes(r.Context())
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "scheduler unavailable: "+status.Convert(err).Message())
		return nil, false
	}
	out := make([]answer, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = g.get(r, n, q)
		}()
	}
	wg.Wait()
	// A node that refused the caller (bad key) refuses everywhere: say so.
	for _, a := range out {
		if a.err == nil && (a.status == http.StatusUnauthorized || a.status == http.StatusForbidden || a.status == http.StatusBadRequest) {
			writeRaw(w, a)
			return nil, false
		}
	}
	return out, true
}

func (g *Gateway) get(r *http.Request, n *pb.Node, q url.Values) answer {
	a := answer{node: n}
	u, err := url.Parse(n.GetStatus().GetApiUrl())
	if err != nil {
		a.err = err
		return a
	}
	u = u.JoinPath(r.URL.Path)
	u.RawQuery = q.Encode()
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		a.err = err
		return a
	}
	req.Header = r.Header.Clone()
	resp, err := g.tr.RoundTrip(req)
	if err != nil {
		a.err = err
		return a
	}
	defer resp.Body.Close()
	a.status, a.header = resp.StatusCode, resp.Header
	a.body, a.err = io.ReadAll(io.LimitReader(resp.Body, maxListBody))
	return a
}

func writeRaw(w http.ResponseWriter, a answer) {
	w.Header().Set("Content-Type", a.header.Get("Content-Type"))
	w.WriteHeader(a.status)
	_, _ = w.Write(a.body)
}

// items decodes a node's JSON array answer, skipping a node that failed
// (logged: a list is best effort over the live nodes).
func (g *Gateway) items(a answer) []json.RawMessage {
	if a.err != nil || a.status != http.StatusOK {
		g.log.Warn("a node did not answer a list", "node", a.node.GetStatus().GetName(), "status", a.status, "err", a.err)
		return nil
	}
	var out []json.RawMessage
	if err := json.Unmarshal(a.body, &out); err != nil {
		g.log.Warn("a node answered a list that is not a JSON array", "node", a.node.GetStatus().GetName(), "err", err)
		return nil
	}
	return out
}

// listAll is GET /sandboxes: every live node's sandboxes.
func (g *Gateway) listAll(w http.ResponseWriter, r *http.Request) {
	ans, ok := g.fanout(w, r, r.URL.Query())
	if !ok {
		return
	}
	all := []json.RawMessage{}
	for _, a := range ans {
		all = append(all, g.items(a)...)
	}
	writeJSON(w, http.StatusOK, all)
}

// concat is /snapshots and /templates: every live node's entries, one per
// id (a template every node holds is listed once).
func (g *Gateway) concat(w http.ResponseWriter, r *http.Request) {
	ans, ok := g.fanout(w, r, r.URL.Query())
	if !ok {
		return
	}
	all := []json.RawMessage{}
	seen := map[string]bool{}
	for _, a := range ans {
		for _, it := range g.items(a) {
			var ids struct {
				TemplateID string `json:"templateID"`
				SnapshotID string `json:"snapshotID"`
			}
			_ = json.Unmarshal(it, &ids)
			key := ids.TemplateID + "/" + ids.SnapshotID
			if key != "/" && seen[key] {
				continue
			}
			seen[key] = true
			all = append(all, it)
		}
	}
	writeJSON(w, http.StatusOK, all)
}

// firstFound sends a call on a snapshot or template to the node holding it
// (snapshots and templates live on the node that made them). A call
// without a body goes to the live nodes in name order until one does not
// answer 404; one with a body (file uploads, build starts: possibly large)
// is streamed to the node that answers the object's GET, or for a template
// create to the first live node.
func (g *Gateway) firstFound(w http.ResponseWriter, r *http.Request) {
	nodes, err := g.liveNodes(r.Context())
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "scheduler unavailable: "+status.Convert(err).Message())
		return
	}
	if len(nodes) == 0 {
		writeError(w, http.StatusServiceUnavailable, "no live node")
		return
	}
	if r.Method == http.MethodGet || r.Method == http.MethodDelete || r.Method == http.MethodHead {
		g.tryEach(w, r, nodes)
		return
	}
	target := nodes[0]
	if probe := objectPath(r.URL.Path); probe != "" {
		if target = g.holder(r, nodes, probe); target == nil {
			writeError(w, http.StatusNotFound, probe+" not found on any live node")
			return
		}
	}
	u, err := url.Parse(target.GetStatus().GetApiUrl())
	if err != nil {
		writeError(w, http.StatusBadGateway, "node url: "+err.Error())
		return
	}
	g.forward(w, r, u, "", false)
}

// objectPath is the GET path naming the template, snapshot or webhook a
// call is about ("" for a template create).
func objectPath(p string) string {
	rest := strings.TrimPrefix(p, "/v2")
	for _, kind := range []string{"/templates/", "/snapshots/", "/events/webhooks/"} {
		if id, ok := strings.CutPrefix(rest, kind); ok {
			id, _, _ = strings.Cut(id, "/")
			if id != "" {
				return kind + id
			}
		}
	}
	return ""
}

// holder is the first live node whose GET of probe answers 200.
func (g *Gateway) holder(r *http.Request, nodes []*pb.Node, probe string) *pb.Node {
	check := r.Clone(r.Context())
	check.URL.Path, check.Body = probe, nil
	for _, n := range nodes {
		if a := g.get(check, n, nil); a.err == nil && a.status == http.StatusOK {
			return n
		}
	}
	return nil
}

// tryEach sends a bodiless call to the nodes until one does not answer 404.
func (g *Gateway) tryEach(w http.ResponseWriter, r *http.Request, nodes []*pb.Node) {
	var last *http.Response
	for _, n := range nodes {
		resp, err := g.send(r, n.GetStatus().GetApiUrl(), nil)
		if err != nil {
			continue
		}
		if resp.StatusCode != http.StatusNotFound {
			if last != nil {
				last.Body.Close()
			}
			relay(w, resp)
			return
		}
		if last != nil {
			last.Body.Close()
		}
		last = bufferResponse(resp)
	}
	if last != nil {
		relay(w, last)
		return
	}
	writeError(w, http.StatusNotFound, "not found on any live node")
}

// listPaged is GET /v2/sandboxes across nodes. The token is a position in
// the whole order (the nodes' own cursor format: a start-time key and the
// id), so every node is asked for the page after the same position and the
// answers are merged; the token stays valid whatever nodes come or go.
func (g *Gateway) listPaged(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := 100
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 100 {
			writeError(w, http.StatusBadRequest, "limit must be 1..100")
			return
		}
		limit = n
	}
	asc := q.Get("order") == "asc"
	ans, ok := g.fanout(w, r, q)
	if !ok {
		return
	}
	type entry struct {
		key string
		raw json.RawMessage
	}
	var all []entry
	more := false
	for _, a := range ans {
		if a.err == nil && a.header.Get("X-Next-Token") != "" {
			more = true
		}
		for _, it := range g.items(a) {
			k, err := sortKey(it, asc)
			if err != nil {
				g.log.Warn("a listed sandbox without id or start time", "node", a.node.GetStatus().GetName(), "err", err)
				continue
			}
			all = append(all, entry{k, it})
		}
	}
	slices.SortFunc(all, func(a, b entry) int { return strings.Compare(a.key, b.key) })
	if len(all) > limit {
		all, more = all[:limit], true
	}
	out := make([]json.RawMessage, len(all))
	for i, e := range all {
		out[i] = e.raw
	}
	if more && len(all) > 0 {
		w.Header().Set("X-Next-Token", base64.RawURLEncoding.EncodeToString([]byte(all[len(all)-1].key)))
	}
	writeJSON(w, http.StatusOK, out)
}

// sortKey is a listed sandbox's position, as the nodes write it in their
// tokens: descending "%020d:id" of 2^62 - start (ns), ascending
// "a:%020d:id" of 2^62 + start.
func sortKey(raw json.RawMessage, asc bool) (string, error) {
	var s struct {
		SandboxID string    `json:"sandboxID"`
		StartedAt time.Time `json:"startedAt"`
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", err
	}
	if s.SandboxID == "" {
		return "", fmt.Errorf("no sandboxID")
	}
	if asc {
		return fmt.Sprintf("a:%020d:%s", int64(1<<62)+s.StartedAt.UnixNano(), s.SandboxID), nil
	}
	return fmt.Sprintf("%020d:%s", int64(1<<62)-s.StartedAt.UnixNano(), s.SandboxID), nil
}
