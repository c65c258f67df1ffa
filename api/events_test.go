package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/eventlog"
	"github.com/agentenv/agentenv/api/webhooks"
	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/sandbox"
)

// TestSandboxEventRoutes: events published on the orchestrator's bus are
// answered by /events/sandboxes and /events/sandboxes/{id} in E2B's
// format, paged and filtered, with clear errors for bad paging and for
// a sandbox the node knows nothing of.
func TestSandboxEventRoutes(t *testing.T) {
	opts := testOptions(t)
	opts.Events = eventlog.New(eventlog.Limits{})
	defer opts.Orchestrator.Subscribe(opts.Events.OnEvent)()
	h := NewHandler(opts)
	get := func(path string, want int) []wire.SandboxEvent {
		t.Helper()
		w := do(h, "GET", path, testKey, "")
		checkError(t, w)
		if w.Code != want {
			t.Fatalf("GET %s: %d %s, want %d", path, w.Code, w.Body, want)
		}
		var out []wire.SandboxEvent
		if want == http.StatusOK {
			if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
				t.Fatalf("GET %s: %v", path, err)
			}
		}
		return out
	}
	started := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	o := opts.Orchestrator
	o.Publish(sandbox.Event{Type: sandbox.EventCreated, SandboxID: "sa", TemplateID: "base", Metadata: map[string]string{"k": "<v>"}, StartedAt: started})
	o.Publish(sandbox.Event{Type: sandbox.EventPaused, SandboxID: "sa", TemplateID: "base", StartedAt: started,
		Time: started.Add(2 * time.Second), VCPUs: 2, MemoryMiB: 512})
	for i := range 12 {
		o.Publish(sandbox.Event{Type: sandbox.EventCreated, SandboxID: fmt.Sprintf("sb%02d", i)})
	}
	o.Publish(sandbox.Event{Type: sandbox.EventResumed, SandboxID: "sa", TemplateID: "base", StartedAt: started})

	feed := get("/events/sandboxes", 200)
	if len(feed) != 10 || feed[0].SandboxId != "sa" || feed[0].Type != sandbox.EventResumed || feed[1].SandboxId != "sb11" {
		t.Fatalf("the feed's first page: %+v", feed)
	}
	if all := get("/events/sandboxes?limit=100&orderAsc=true", 200); len(all) != 15 || all[0].Type != sandbox.EventCreated || all[0].SandboxId != "sa" {
		t.Errorf("the whole feed oldest first: %d events, first %+v", len(all), all[0])
	}
	hist := get("/events/sandboxes/sa?orderAsc=true", 200)
	if len(hist) != 3 || hist[0].Type != sandbox.EventCreated || hist[1].Type != sandbox.EventPaused || hist[2].Type != sandbox.EventResumed {
		t.Fatalf("sa's history %+v", hist)
	}
	c, p := hist[0], hist[1]
	if c.Version == "" || c.Id == "" || c.SandboxTemplateId != "base" || c.SandboxTeamId == "" || c.Timestamp.IsZero() ||
		c.EventData == nil || (*c.EventData.SandboxMetadata)["k"] != "<v>" || c.EventData.Execution != nil {
		t.Errorf("created event %+v", c)
	}
	if p.EventData == nil || p.EventData.Execution == nil || p.EventData.Execution.ExecutionTime != 2000 || p.EventData.Execution.VcpuCount != 2 ||
		p.SandboxExecutionId != c.SandboxExecutionId {
		t.Errorf("paused event %+v", p)
	}
	if got := get("/events/sandboxes/sa?types=sandbox.lifecycle.paused&types=sandbox.lifecycle.resumed", 200); len(got) != 2 || got[0].Type != sandbox.EventResumed {
		t.Errorf("filtered by types: %+v", got)
	}
	if got := get("/events/sandboxes/sa?offset=1&limit=1", 200); len(got) != 1 || got[0].Type != sandbox.EventPaused {
		t.Errorf("offset 1 limit 1: %+v", got)
	}
	get("/events/sandboxes?limit=0", 400)
	get("/events/sandboxes?limit=101", 400)
	get("/events/sandboxes/sa?offset=-1", 400)
	get("/events/sandboxes/nosuch", 404)
	if w := do(h, "GET", "/events/sandboxes", "", ""); w.Code != http.StatusUnauthorized {
		t.Errorf("without a key: %d", w.Code)
	}
	opts.Events = nil
	if w := do(NewHandler(opts), "GET", "/events/sandboxes", testKey, ""); w.Code != http.StatusNotFound {
		t.Errorf("without an event log: %d", w.Code)
	}
}

// TestWebhookDeliveriesRoute: a delivery to a real receiver is listed
// with its status; an unknown webhook is a 404.
func TestWebhookDeliveriesRoute(t *testing.T) {
	got := make(chan struct{}, 10)
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		got <- struct{}{}
	}))
	defer rc.Close()
	opts := testOptions(t)
	d, err := webhooks.New(opts.Store, webhooks.Options{})
	if err != nil {
		t.Fatal(err)
	}
	d.Start(context.Background())
	defer d.Close()
	defer opts.Orchestrator.Subscribe(d.OnEvent)()
	opts.Webhooks = d
	h := NewHandler(opts)
	w := do(h, "POST", "/events/webhooks", testKey, `{"url":"`+rc.URL+`","events":["sandbox.lifecycle.killed"]}`)
	var c wire.WebhookConfig
	if w.Code != 201 || json.Unmarshal(w.Body.Bytes(), &c) != nil {
		t.Fatalf("create: %d %s", w.Code, w.Body)
	}
	opts.Orchestrator.Publish(sandbox.Event{Type: sandbox.EventKilled, SandboxID: "sk"})
	<-got
	var list []wire.WebhookDelivery
	for deadline := time.Now().Add(30 * time.Second); len(list) == 0; time.Sleep(5 * time.Millisecond) {
		w = do(h, "GET", "/events/webhooks/"+c.Id+"/deliveries", testKey, "")
		if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &list) != nil {
			t.Fatalf("deliveries: %d %s", w.Code, w.Body)
		}
		if time.Now().After(deadline) {
			t.Fatal("the delivery the receiver took is not listed")
		}
	}
	a := list[0]
	if a.StatusCode == nil || *a.StatusCode != 200 || a.Outcome != "delivered" || a.Attempt != 1 || a.Event != sandbox.EventKilled ||
		a.SandboxID != "sk" || a.WebhookID != c.Id || a.Error != nil {
		t.Errorf("delivery %+v", a)
	}
	w = do(h, "GET", "/events/webhooks/nosuch/deliveries", testKey, "")
	checkError(t, w)
	if w.Code != http.StatusNotFound {
		t.Errorf("an unknown webhook's deliveries: %d", w.Code)
	}
}
