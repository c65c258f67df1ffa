package api

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentenv/agentenv/orchestrator"
	"github.com/agentenv/agentenv/store"
)

// TestNodeStatusAndBuild: /nodes reports the build's commit and date and
// the node's status as set by POST /nodes/{id}; a draining node refuses
// creates and forks with 503 and takes them again once ready.
func TestNodeStatusAndBuild(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	o, err := orchestrator.New(t.Context(), orchestrator.Options{DataDir: dir, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	h := NewHandler(Options{Orchestrator: o, APIKey: testKey, DefaultTimeout: 15 * time.Second, MaxTimeout: time.Hour,
		Node: NodeInfo{ID: "node1", Version: "1.2.3", Commit: "abc123", Date: "2026-01-02T03:04:05Z"}})
	node := func() Node {
		t.Helper()
		w := do(h, "GET", "/nodes", testKey, "")
		var ns []Node
		if err := json.Unmarshal(w.Body.Bytes(), &ns); err != nil || w.Code != 200 || len(ns) != 1 {
			t.Fatalf("GET /nodes: %d %s", w.Code, w.Body)
		}
		return ns[0]
	}
	if n := node(); n.Status != NodeStatusReady || deref(n.Commit) != "abc123" || deref(n.Date) != "2026-01-02T03:04:05Z" || n.Version != "1.2.3" {
		t.Errorf("node %+v: want ready with the build's commit and date", n)
	}
	set := func(status string, want int) {
		t.Helper()
		w := do(h, "POST", "/nodes/node1", testKey, `{"status":"`+status+`"}`)
		checkError(t, w)
		if w.Code != want {
			t.Fatalf("set status %s: %d %s, want %d", status, w.Code, w.Body, want)
		}
	}
	set("draining", http.StatusNoContent)
	if n := node(); n.Status != NodeStatusDraining {
		t.Errorf("after draining: status %s", n.Status)
	}
	for _, c := range [][2]string{{"/sandboxes", `{"templateID":"base"}`}, {"/v2/sandboxes", `{"templateID":"base"}`}, {"/sandboxes/abc/fork", `{"count":1}`}} {
		w := do(h, "POST", c[0], testKey, c[1])
		checkError(t, w)
		if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" {
			t.Errorf("POST %s while draining: %d, want 503 with Retry-After", c[0], w.Code)
		}
	}
	set("ready", http.StatusNoContent)
	if n := node(); n.Status != NodeStatusReady {
		t.Errorf("after ready: status %s", n.Status)
	}
	// Ready again: the create goes on to the orchestrator (no such template here).
	if w := do(h, "POST", "/sandboxes", testKey, `{"templateID":"base"}`); w.Code != http.StatusNotFound {
		t.Errorf("create when ready: %d %s, want the orchestrator's 404", w.Code, w.Body)
	}
	set("sleeping", http.StatusBadRequest)
	if w := do(h, "POST", "/nodes/other", testKey, `{"status":"draining"}`); w.Code != http.StatusNotFound {
		t.Errorf("another node: %d, want 404", w.Code)
	}
}
