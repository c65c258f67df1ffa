package gateway

import (
	"cmp"
	"encoding/base64"
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
	"google.golang.org/grpc/status"
)

// snapCursor is a position in the gateway's /snapshots. Every node pages
// its own snapshots newest first with its own token (the id of the last
// one it listed), so the gateway's token carries each node's, and which
// nodes have nothing left. A node that joined since starts from its first.
type snapCursor struct {
	After map[string]string `json:"a,omitempty"`
	Done  []string          `json:"d,omitempty"`
}

// snapPage is one node's answer: its snapshots in its order, and whether
// it has more past them.
type snapPage struct {
	items []snapItem
	more  bool
}

type snapItem struct {
	node    string
	index   int // in its node's page
	id      string
	created time.Time
	raw     json.RawMessage
}

// listSnapshots is GET /snapshots across nodes: each node not done is
// asked for a page after its own position, the pages are merged newest
// first (a prefix of every node's page is taken, so no snapshot is skipped
// or listed twice), and the token records where each node stands.
func (g *Gateway) listSnapshots(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit := 100
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 100 {
			writeError(w, http.StatusBadRequest, "limit must be within 1..100")
			return
		}
		limit = n
	}
	cur, err := decodeSnapCursor(q.Get("nextToken"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "nextToken: not one this gateway gave")
		return
	}
	nodes, err := g.liveNodes(r.Context())
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "scheduler unavailable: "+status.Convert(err).Message())
		return
	}
	pages := g.snapshotPages(r, nodes, cur)
	var all []snapItem
	for _, p := range pages {
		all = append(all, p.items...)
	}
	slices.SortFunc(all, func(a, b snapItem) int {
		return cmp.Or(b.created.Compare(a.created), cmp.Compare(a.node, b.node), cmp.Compare(a.index, b.index))
	})
	taken := all[:min(limit, len(all))]
	next, more := advance(cur, pages, taken)
	out := make([]json.RawMessage, len(taken))
	for i, it := range taken {
		out[i] = it.raw
	}
	if more {
		if tok, err := json.Marshal(next); err == nil {
			w.Header().Set("X-Next-Token", base64.RawURLEncoding.EncodeToString(tok))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// snapshotPages asks every live node not done for its page after its
// position, at once.
func (g *Gateway) snapshotPages(r *http.Request, nodes []*pb.Node, cur snapCursor) map[string]snapPage {
	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		pages = map[string]snapPage{}
	)
	for _, n := range nodes {
		name := n.GetStatus().GetName()
		if slices.Contains(cur.Done, name) {
			continue
		}
		q := r.URL.Query()
		q.Del("nextToken")
		if tok := cur.After[name]; tok != "" {
			q.Set("nextToken", tok)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := g.get(r, n, q)
			p := snapPage{items: g.snapItems(a), more: a.err == nil && a.header.Get("X-Next-Token") != ""}
			mu.Lock()
			defer mu.Unlock()
			pages[name] = p
		}()
	}
	wg.Wait()
	return pages
}

func (g *Gateway) snapItems(a answer) []snapItem {
	var out []snapItem
	for _, raw := range g.items(a) {
		var s struct {
			SnapshotID string    `json:"snapshotID"`
			CreatedAt  time.Time `json:"createdAt"`
		}
		if json.Unmarshal(raw, &s) != nil || s.SnapshotID == "" {
			continue
		}
		out = append(out, snapItem{node: a.node.GetStatus().GetName(), index: len(out), id: s.SnapshotID, created: s.CreatedAt, raw: raw})
	}
	return out
}

// advance is the cursor past the taken items: a node's position moves to
// the last of its snapshots taken; a node whose page was its last and was
// taken whole is done. more: some node asked is not done.
func advance(cur snapCursor, pages map[string]snapPage, taken []snapItem) (snapCursor, bool) {
	next := snapCursor{After: maps.Clone(cur.After), Done: slices.Clone(cur.Done)}
	if next.After == nil {
		next.After = map[string]string{}
	}
	count := map[string]int{}
	for _, it := range taken {
		count[it.node]++
		next.After[it.node] = it.id // taken in each node's own order
	}
	more := false
	for node, p := range pages {
		if !p.more && count[node] == len(p.items) {
			next.Done = append(next.Done, node)
			delete(next.After, node)
			continue
		}
		more = true
	}
	return next, more
}

func decodeSnapCursor(tok string) (snapCursor, error) {
	var c snapCursor
	if tok == "" {
		return c, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return c, err
	}
	return c, json.Unmarshal(b, &c)
}
