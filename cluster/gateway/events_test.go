package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fakeEvent is a node's lifecycle event, as aenvd answers it (the fields
// the gateway reads, and the sandbox's).
type fakeEvent struct {
	ID        string    `json:"id"`
	SandboxID string    `json:"sandboxId"`
	Timestamp time.Time `json:"timestamp"`
}

// eventRoutes answers /events/... as aenvd does: events paged newest first
// (limit 1..100), 404 for a sandbox without events; webhooks by id.
func (f *fakeNode) eventRoutes(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := r.URL.Path
	if hook, ok := strings.CutPrefix(p, "/events/webhooks/"); ok {
		hook, _, _ = strings.Cut(hook, "/")
		if !slices.Contains(f.hooks, hook) {
			writeError(w, http.StatusNotFound, "no webhook "+hook)
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"node": f.name, "id": hook, "method": r.Method, "path": p})
		return
	}
	if p == "/events/webhooks" {
		out := []map[string]string{}
		for _, h := range f.hooks {
			out = append(out, map[string]string{"id": h})
		}
		writeJSON(w, http.StatusOK, out)
		return
	}
	q := r.URL.Query()
	offset, _ := strconv.Atoi(q.Get("offset"))
	limit, err := strconv.Atoi(q.Get("limit"))
	if err != nil || limit < 1 || limit > 100 {
		writeError(w, http.StatusBadRequest, "bad limit")
		return
	}
	id := strings.TrimPrefix(p, "/events/sandboxes/")
	var sel []fakeEvent
	for _, e := range f.events {
		if p == "/events/sandboxes" || e.SandboxID == id {
			sel = append(sel, e)
		}
	}
	if p != "/events/sandboxes" && len(sel) == 0 {
		writeError(w, http.StatusNotFound, "no sandbox "+id)
		return
	}
	if q.Get("orderAsc") != "true" {
		slices.Reverse(sel)
	}
	sel = sel[min(offset, len(sel)):]
	writeJSON(w, http.StatusOK, sel[:min(limit, len(sel))])
}

// eventIDs asks the gateway for a page of events and returns their ids.
func eventIDs(t *testing.T, fx *fixture, path string) []string {
	t.Helper()
	code, b, _ := fx.do(t, "GET", path, "", "")
	var es []fakeEvent
	if err := json.Unmarshal(b, &es); code != http.StatusOK || err != nil {
		t.Fatalf("GET %s: %d %s", path, code, b)
	}
	ids := []string{}
	for _, e := range es {
		ids = append(ids, e.ID)
	}
	return ids
}

// TestEventsMergedAcrossNodes: the feed and a sandbox's history through
// the gateway are every node's events merged by time, paged as one list
// (beyond one node page of 100), in either order.
func TestEventsMergedAcrossNodes(t *testing.T) {
	fx := newFixture(t, "a", "b", "c")
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var all []string // oldest first
	for i := range 260 {
		f := fx.nodes[(i*7)%5%3] // uneven: a holds most
		sb := fmt.Sprintf("s%d", i%9)
		e := fakeEvent{ID: fmt.Sprintf("e%03d", i), SandboxID: sb, Timestamp: base.Add(time.Duration(i) * time.Second)}
		f.events = append(f.events, e)
		all = append(all, e.ID)
	}
	newest := slices.Clone(all)
	slices.Reverse(newest)
	if got := eventIDs(t, fx, "/events/sandboxes"); !slices.Equal(got, newest[:10]) {
		t.Errorf("the default page %v, want %v", got, newest[:10])
	}
	if got := eventIDs(t, fx, "/events/sandboxes?offset=150&limit=100"); !slices.Equal(got, newest[150:250]) {
		t.Errorf("offset 150: %v, want %v", got, newest[150:250])
	}
	if got := eventIDs(t, fx, "/events/sandboxes?orderAsc=true&offset=255&limit=100"); !slices.Equal(got, all[255:]) {
		t.Errorf("oldest first from 255: %v, want %v", got, all[255:])
	}
	// s4's events are on every node: its history is all of them, in order.
	var s4 []string
	for i, id := range all {
		if i%9 == 4 {
			s4 = append(s4, id)
		}
	}
	if got := eventIDs(t, fx, "/events/sandboxes/s4?orderAsc=true&limit=100"); !slices.Equal(got, s4) {
		t.Errorf("s4's history %v, want %v", got, s4)
	}
	if code, b, _ := fx.do(t, "GET", "/events/sandboxes/nosuch", "", ""); code != http.StatusNotFound {
		t.Errorf("an unknown sandbox's events: %d %s", code, b)
	}
	for _, bad := range []string{"limit=0", "limit=101", "offset=-1", "orderAsc=maybe"} {
		if code, b, _ := fx.do(t, "GET", "/events/sandboxes?"+bad, "", ""); code != http.StatusBadRequest || !strings.Contains(string(b), "bad") {
			t.Errorf("%s: %d %s, want 400", bad, code, b)
		}
	}
}

// TestWebhooksThroughGateway: the list is every node's webhooks; a call
// on one reaches the node holding it; a create is refused with why.
func TestWebhooksThroughGateway(t *testing.T) {
	fx := newFixture(t, "a", "b")
	fx.nodes[0].hooks = []string{"ha"}
	fx.nodes[1].hooks = []string{"hb1", "hb2"}
	code, b, _ := fx.do(t, "GET", "/events/webhooks", "", "")
	var list []map[string]string
	if err := json.Unmarshal(b, &list); code != http.StatusOK || err != nil || len(list) != 3 {
		t.Fatalf("list: %d %s", code, b)
	}
	for _, c := range []struct{ method, path, node string }{
		{"GET", "/events/webhooks/hb2/deliveries", "b"},
		{"GET", "/events/webhooks/ha", "a"},
		{"PATCH", "/events/webhooks/hb1", "b"},
		{"DELETE", "/events/webhooks/ha", "a"},
	} {
		code, b, _ := fx.do(t, c.method, c.path, "", `{"enabled":false}`)
		var got map[string]string
		if err := json.Unmarshal(b, &got); code != http.StatusOK || err != nil || got["node"] != c.node || got["method"] != c.method || got["path"] != c.path {
			t.Errorf("%s %s: %d %s, want node %s's answer", c.method, c.path, code, b, c.node)
		}
	}
	if code, b, _ := fx.do(t, "GET", "/events/webhooks/nosuch/deliveries", "", ""); code != http.StatusNotFound {
		t.Errorf("an unknown webhook: %d %s", code, b)
	}
	if code, b, _ := fx.do(t, "POST", "/events/webhooks", "", `{"url":"http://x/","events":["sandbox.lifecycle.killed"]}`); code != http.StatusNotImplemented ||
		!strings.Contains(string(b), "each node") {
		t.Errorf("create through the gateway: %d %s, want 501 saying why", code, b)
	}
}
