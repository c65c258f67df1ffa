package api

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/webhooks"
	"github.com/agentenv/agentenv/orchestrator"
	"github.com/agentenv/agentenv/store"
)

// TestWebhookRoutes: E2B's /events/webhooks CRUD over a real dispatcher
// and store, with E2B's shapes and error bodies.
func TestWebhookRoutes(t *testing.T) {
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
	d, err := webhooks.New(st, webhooks.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h := NewHandler(Options{Orchestrator: o, Store: st, Webhooks: d, APIKey: testKey, DefaultTimeout: 15 * time.Second, MaxTimeout: time.Hour})
	expect := func(method, path, body string, want int) []byte {
		t.Helper()
		w := do(h, method, path, testKey, body)
		checkError(t, w)
		if w.Code != want {
			t.Fatalf("%s %s: %d %s, want %d", method, path, w.Code, w.Body, want)
		}
		return w.Body.Bytes()
	}
	var c WebhookConfig
	json.Unmarshal(expect("POST", "/events/webhooks", `{"name":"mine","url":"http://127.0.0.1:9/hook",`+
		`"events":["sandbox.lifecycle.killed","sandbox.lifecycle.created","sandbox.lifecycle.updated"],"signatureSecret":"x"}`, 201), &c)
	if c.Id == "" || c.TeamID == "" || !c.Enabled || c.Name != "mine" || len(c.Events) != 3 || c.CreatedAt.IsZero() {
		t.Fatalf("created %+v", c)
	}
	if b := expect("GET", "/events/webhooks/"+c.Id, "", 200); json.Valid(b) && string(b) == "" {
		t.Fatal("empty")
	}
	var list []WebhookConfig
	json.Unmarshal(expect("GET", "/events/webhooks", "", 200), &list)
	if len(list) != 1 || list[0].Id != c.Id {
		t.Fatalf("list %+v", list)
	}
	var upd WebhookConfig
	json.Unmarshal(expect("PATCH", "/events/webhooks/"+c.Id, `{"enabled":false,"events":["sandbox.lifecycle.paused"]}`, 200), &upd)
	if upd.Enabled || len(upd.Events) != 1 || upd.Events[0] != "sandbox.lifecycle.paused" || upd.Url != c.Url || upd.Name != "mine" {
		t.Fatalf("updated %+v", upd)
	}
	if b := expect("GET", "/events/webhooks/"+c.Id, "", 200); string(b) == "" || json.Unmarshal(b, &upd) != nil || upd.Enabled {
		t.Fatalf("the update did not stick: %s", b)
	}
	expect("PATCH", "/events/webhooks/"+c.Id, `{"url":"file:///etc/passwd"}`, 400)
	expect("POST", "/events/webhooks", `{"url":"http://x/","events":["nope"]}`, 400)
	expect("POST", "/events/webhooks", `{"url":"http://x/"}`, 400)
	expect("DELETE", "/events/webhooks/"+c.Id, "", 204)
	expect("DELETE", "/events/webhooks/"+c.Id, "", 404)
	expect("GET", "/events/webhooks/"+c.Id, "", 404)
	if len(d.List()) != 0 {
		t.Error("the dispatcher still holds the deleted webhook")
	}
	// Without a dispatcher the routes answer 404, not a panic.
	bare := NewHandler(Options{Orchestrator: o, APIKey: testKey, DefaultTimeout: 15 * time.Second, MaxTimeout: time.Hour})
	if w := do(bare, "GET", "/events/webhooks", testKey, ""); w.Code != http.StatusNotFound {
		t.Errorf("no dispatcher: %d", w.Code)
	}
}
