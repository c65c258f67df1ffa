package api

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/api/wire"
)

// TestNodeStatusAndBuild: /nodes reports the build's commit and date and
// the node's status as set by POST /nodes/{id}; a draining node refuses
// creates and forks with 503 and takes them again once ready.
func TestNodeStatusAndBuild(t *testing.T) {
	opts := testOptions(t)
	opts.Node = NodeInfo{ID: "node1", Version: "1.2.3", Commit: "abc123", Date: "2026-01-02T03:04:05Z"}
	h := NewHandler(opts)
	node := func() wire.Node {
		t.Helper()
		w := do(h, "GET", "/nodes", testKey, "")
		var ns []wire.Node
		if err := json.Unmarshal(w.Body.Bytes(), &ns); err != nil || w.Code != 200 || len(ns) != 1 {
			t.Fatalf("GET /nodes: %d %s", w.Code, w.Body)
		}
		return ns[0]
	}
	if n := node(); n.Status != wire.NodeStatusReady || deref(n.Commit) != "abc123" || deref(n.Date) != "2026-01-02T03:04:05Z" || n.Version != "1.2.3" {
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
	if n := node(); n.Status != wire.NodeStatusDraining {
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
	if n := node(); n.Status != wire.NodeStatusReady {
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

// TestNodeStatusSurvivesRestart: a drain set through POST /nodes/{id} is
// kept in the state directory, so a new handler (aenvd restarted) on the
// same directory and store starts draining; ready is kept the same way.
func TestNodeStatusSurvivesRestart(t *testing.T) {
	opts := testOptions(t)
	opts.StateDir = t.TempDir()
	start := func() http.Handler { return NewHandler(opts) }
	status := func(h http.Handler) wire.NodeStatus {
		t.Helper()
		w := do(h, "GET", "/nodes/node1", testKey, "")
		var n wire.Node
		if err := json.Unmarshal(w.Body.Bytes(), &n); err != nil || w.Code != http.StatusOK {
			t.Fatalf("GET /nodes/node1: %d %s", w.Code, w.Body)
		}
		return n.Status
	}
	h := start()
	if s := status(h); s != wire.NodeStatusReady {
		t.Fatalf("a new node: %s, want ready", s)
	}
	if w := do(h, "POST", "/nodes/node1", testKey, `{"status":"draining"}`); w.Code != http.StatusNoContent {
		t.Fatalf("drain: %d %s", w.Code, w.Body)
	}
	h = start()
	if s := status(h); s != wire.NodeStatusDraining {
		t.Fatalf("after a restart of a drained node: %s, want draining", s)
	}
	if w := do(h, "POST", "/sandboxes", testKey, `{"templateID":"base"}`); w.Code != http.StatusServiceUnavailable {
		t.Errorf("create after the restart: %d, want 503 (draining)", w.Code)
	}
	if w := do(h, "POST", "/nodes/node1", testKey, `{"status":"ready"}`); w.Code != http.StatusNoContent {
		t.Fatalf("ready: %d %s", w.Code, w.Body)
	}
	if s := status(start()); s != wire.NodeStatusReady {
		t.Fatalf("after a restart of a node made ready: %s, want ready", s)
	}
}

// TestNodeStatusFileDamaged: a status file that cannot be parsed (or is
// not a status) starts the node draining rather than crashing or
// silently putting it back into service.
func TestNodeStatusFileDamaged(t *testing.T) {
	for _, body := range []string{`{"status":`, `{"status":"sleeping"}`, strings.Repeat(" ", maxNodeStatusFile+1)} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, nodeStatusFile), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := loadDraining(dir); err == nil {
			t.Errorf("loadDraining of %.20q: no error", body)
		}
		s := &Server{opts: Options{StateDir: dir}, log: slog.New(slog.NewTextHandler(t.Output(), nil))}
		s.initDraining()
		if !s.draining.Load() {
			t.Errorf("a node started on the status file %.20q is not draining", body)
		}
	}
}
