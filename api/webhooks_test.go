package api

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/agentenv/agentenv/api/webhooks"
	"github.com/agentenv/agentenv/api/wire"
)

// TestWebhookRoutes: E2B's /events/webhooks CRUD over a real dispatcher
// and store, with E2B's shapes and error bodies.
func TestWebhookRoutes(t *testing.T) {
	opts := testOptions(t)
	d, err := webhooks.New(opts.Store, webhooks.Options{})
	if err != nil {
		t.Fatal(err)
	}
	opts.Webhooks = d
	h := NewHandler(opts)
	expect := func(method, path, body string, want int) []byte {
		t.Helper()
		w := do(h, method, path, testKey, body)
		checkError(t, w)
		if w.Code != want {
			t.Fatalf("%s %s: %d %s, want %d", method, path, w.Code, w.Body, want)
		}
		return w.Body.Bytes()
	}
	var c wire.WebhookConfig
	json.Unmarshal(expect("POST", "/events/webhooks", `{"name":"mine","url":"http://127.0.0.1:9/hook",`+
		`"events":["sandbox.lifecycle.killed","sandbox.lifecycle.created","sandbox.lifecycle.updated"],"signatureSecret":"x"}`, 201), &c)
	if c.Id == "" || c.TeamID == "" || !c.Enabled || c.Name != "mine" || len(c.Events) != 3 || c.CreatedAt.IsZero() {
		t.Fatalf("created %+v", c)
	}
	if b := expect("GET", "/events/webhooks/"+c.Id, "", 200); json.Valid(b) && string(b) == "" {
		t.Fatal("empty")
	}
	var list []wire.WebhookConfig
	json.Unmarshal(expect("GET", "/events/webhooks", "", 200), &list)
	if len(list) != 1 || list[0].Id != c.Id {
		t.Fatalf("list %+v", list)
	}
	var upd wire.WebhookConfig
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
	opts.Webhooks = nil
	bare := NewHandler(opts)
	if w := do(bare, "GET", "/events/webhooks", testKey, ""); w.Code != http.StatusNotFound {
		t.Errorf("no dispatcher: %d", w.Code)
	}
}
