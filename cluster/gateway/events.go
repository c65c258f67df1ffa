package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
	"google.golang.org/grpc/status"
)

// Lifecycle events and webhooks through the gateway. Each node keeps the
// events of what it ran, and a sandbox may have run on several (it
// resumes where there is room), so GET /events/sandboxes[/{id}] merges
// every live node's events by time and pages them here. Webhooks are
// registered with each node (a cluster has no registry of its own): the
// gateway lists every node's, sends a call on one to the node holding it,
// and refuses to create one, which would reach one node's events only.

// eventPage is what the gateway asks a node for at a time (a node's most).
const eventPage = 100

// maxEventPages bounds the pages read from one node for one answer.
const maxEventPages = 100

// eventPaging is an events call's offset, limit and order.
type eventPaging struct {
	offset, limit int
	asc           bool
}

func parseEventPaging(q url.Values) (eventPaging, error) {
	p := eventPaging{limit: 10}
	var err error
	if s := q.Get("offset"); s != "" {
		if p.offset, err = strconv.Atoi(s); err != nil || p.offset < 0 {
			return p, fmt.Errorf("bad offset %q: want an integer of at least 0", s)
		}
	}
	if s := q.Get("limit"); s != "" {
		if p.limit, err = strconv.Atoi(s); err != nil || p.limit < 1 || p.limit > eventPage {
			return p, fmt.Errorf("bad limit %q: want an integer 1..%d", s, eventPage)
		}
	}
	if s := q.Get("orderAsc"); s != "" {
		if p.asc, err = strconv.ParseBool(s); err != nil {
			return p, fmt.Errorf("bad orderAsc %q: want true or false", s)
		}
	}
	return p, nil
}

// event is what the merge reads of a node's event.
type event struct {
	raw json.RawMessage
	at  time.Time
	id  string
}

// sandboxEvents is GET /events/sandboxes and /events/sandboxes/{id}.
func (g *Gateway) sandboxEvents(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		writeError(w, http.StatusMethodNotAllowed, "method "+r.Method+" not allowed on "+r.URL.Path)
		return
	}
	p, err := parseEventPaging(r.URL.Query())
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	nodes, err := g.liveNodes(r.Context())
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "scheduler unavailable: "+status.Convert(err).Message())
		return
	}
	answers := make([]nodeEvents, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() { answers[i] = g.eventsOf(r, n, p) })
	}
	wg.Wait()
	var all []event
	found := false
	for _, a := range answers {
		if a.refused != nil { // a bad key or query is refused by every node
			writeRaw(w, *a.refused)
			return
		}
		found = found || a.found
		all = append(all, a.events...)
	}
	if !found {
		writeError(w, http.StatusNotFound, "no live node holds "+r.URL.Path)
		return
	}
	sort.SliceStable(all, func(i, j int) bool {
		if !all[i].at.Equal(all[j].at) {
			return all[i].at.Before(all[j].at) == p.asc
		}
		return all[i].id < all[j].id
	})
	out := []json.RawMessage{}
	for i := p.offset; i < len(all) && len(out) < p.limit; i++ {
		out = append(out, all[i].raw)
	}
	writeJSON(w, http.StatusOK, out)
}

// nodeEvents is one node's part of an events call.
type nodeEvents struct {
	events  []event
	found   bool    // the node answered 200
	refused *answer // the node refused the caller (401, 403, 400)
}

// eventsOf reads one node's first offset+limit events in p's order.
func (g *Gateway) eventsOf(r *http.Request, n *pb.Node, p eventPaging) nodeEvents {
	var out nodeEvents
	q := r.URL.Query()
	q.Set("limit", strconv.Itoa(eventPage))
	for page := 0; page < maxEventPages && len(out.events) < p.offset+p.limit; page++ {
		q.Set("offset", strconv.Itoa(page*eventPage))
		a := g.get(r, n, q)
		switch {
		case a.err == nil && (a.status == http.StatusUnauthorized || a.status == http.StatusForbidden || a.status == http.StatusBadRequest):
			out.refused = &a
			return out
		case a.err == nil && a.status == http.StatusNotFound:
			return out
		}
		items := g.items(a)
		if a.err != nil || a.status != http.StatusOK {
			return out
		}
		out.found = true
		for _, it := range items {
			var head struct {
				ID        string    `json:"id"`
				Timestamp time.Time `json:"timestamp"`
			}
			if err := json.Unmarshal(it, &head); err != nil {
				g.log.Warn("a node answered an event without a timestamp", "node", n.GetStatus().GetName(), "err", err)
				continue
			}
			out.events = append(out.events, event{raw: it, at: head.Timestamp, id: head.ID})
		}
		if len(items) < eventPage {
			break
		}
	}
	return out
}

// webhooks is /events/webhooks[/...].
func (g *Gateway) webhooks(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path != "/events/webhooks":
		g.firstFound(w, r) // ids are unique: the node holding it answers
	case r.Method == http.MethodGet:
		g.listAll(w, r)
	default:
		writeError(w, http.StatusNotImplemented, "the gateway cannot register a webhook: webhooks are registered with each "+
			"node's own API (a node sends the events of the sandboxes it runs); the gateway lists every node's webhooks and their deliveries")
	}
}

// isEvents reports whether p is an events route.
func isEvents(p string) bool {
	return p == "/events/sandboxes" || strings.HasPrefix(p, "/events/sandboxes/")
}
