package webhooks

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/store"
)

// receiver is a real HTTP server that records what it got and fails the
// first `failFirst` requests with 503.
type receiver struct {
	srv       *httptest.Server
	mu        sync.Mutex
	failFirst int
	got       []received
	arrived   chan struct{}
}

type received struct {
	header http.Header
	body   []byte
	status int
}

func newReceiver(t *testing.T, failFirst int) *receiver {
	r := &receiver{failFirst: failFirst, arrived: make(chan struct{}, 100)}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		status := http.StatusNoContent
		if len(r.got) < r.failFirst {
			status = http.StatusServiceUnavailable
		}
		r.got = append(r.got, received{req.Header.Clone(), body, status})
		r.mu.Unlock()
		w.WriteHeader(status)
		r.arrived <- struct{}{}
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// await waits for n requests (a guard against a hang, not a measurement).
func (r *receiver) await(t *testing.T, n int) []received {
	t.Helper()
	for {
		r.mu.Lock()
		got := append([]received(nil), r.got...)
		r.mu.Unlock()
		if len(got) >= n {
			return got
		}
		select {
		case <-r.arrived:
		case <-time.After(30 * time.Second):
			t.Fatalf("the receiver got %d requests, want %d", len(got), n)
		}
	}
}

// waitPending waits until d has no pending delivery (a guard against a
// hang, not a measurement).
func waitPending(t *testing.T, d *Dispatcher) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for d.Pending() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d deliveries still pending after the receiver took them", d.Pending())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func openStore(t *testing.T, dir string) *store.Store {
	t.Helper()
	st, err := store.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func TestSignature(t *testing.T) {
	// Computed independently: printf '%s' 'secret{"a":1}' | sha256sum | xxd -r -p | base64 | tr -d =
	if got := Sign("secret", []byte(`{"a":1}`)); got != "N7005LKS7534v+cOP1BSYTkklJDDwllM8gF1unZl4B0" {
		t.Errorf("Sign = %s", got)
	}
}

func TestValidate(t *testing.T) {
	d, err := New(openStore(t, t.TempDir()), Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []Webhook{
		{URL: "ftp://x/", Events: []string{sandbox.EventCreated}},
		{URL: "http://", Events: []string{sandbox.EventCreated}},
		{URL: "http://x/", Events: nil},
		{URL: "http://x/", Events: []string{"sandbox.lifecycle.exploded"}},
	} {
		if _, err := d.Create(w); !errors.Is(err, ErrInvalid) {
			t.Errorf("Create(%+v): %v, want ErrInvalid", w, err)
		}
	}
	if _, err := d.Update("nosuch", Patch{}); !errors.Is(err, ErrNotFound) {
		t.Errorf("Update of an unknown webhook: %v", err)
	}
}

// TestDeliverSignedWithRetries: a subscribed event reaches the receiver
// signed, in E2B's format, after the receiver's failures; an event the
// webhook did not subscribe to, or a disabled webhook, sends nothing.
func TestDeliverSignedWithRetries(t *testing.T) {
	rc := newReceiver(t, 2)
	st := openStore(t, t.TempDir())
	defer st.Close()
	d, err := New(st, Options{Backoff: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	d.Start(context.Background())
	defer d.Close()
	h, err := d.Create(Webhook{Name: "test", URL: rc.srv.URL + "/hook", Enabled: true, Secret: "s3cret",
		Events: []string{sandbox.EventKilled, sandbox.EventCreated}})
	if err != nil {
		t.Fatal(err)
	}
	started := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	d.OnEvent(sandbox.Event{Type: sandbox.EventPaused, SandboxID: "sbx1"}) // not subscribed
	d.OnEvent(sandbox.Event{Type: sandbox.EventKilled, SandboxID: "sbx1", TemplateID: "base",
		Metadata: map[string]string{"k": "v"}, Time: started.Add(1500 * time.Millisecond), StartedAt: started, VCPUs: 2, MemoryMiB: 512})
	got := rc.await(t, 3)
	if got[0].status != 503 || got[1].status != 503 || got[2].status != 204 {
		t.Fatalf("statuses %d %d %d, want two failures then success", got[0].status, got[1].status, got[2].status)
	}
	last := got[2]
	if sig := last.header.Get("e2b-signature"); sig != Sign("s3cret", last.body) {
		t.Errorf("e2b-signature %q does not sign the body", sig)
	}
	if last.header.Get("e2b-webhook-id") != h.ID || last.header.Get("e2b-signature-version") != "v1" ||
		last.header.Get("e2b-delivery-id") == "" || last.header.Get("e2b-delivery-id") == got[1].header.Get("e2b-delivery-id") {
		t.Errorf("headers %v", last.header)
	}
	var p map[string]any
	if err := json.Unmarshal(last.body, &p); err != nil {
		t.Fatal(err)
	}
	exec, _ := p["eventData"].(map[string]any)["execution"].(map[string]any)
	if p["version"] != "v2" || p["type"] != sandbox.EventKilled || p["sandboxId"] != "sbx1" || p["sandboxTemplateId"] != "base" ||
		p["eventData"].(map[string]any)["sandbox_metadata"].(map[string]any)["k"] != "v" || p["id"] == "" ||
		exec == nil || exec["vcpu_count"] != float64(2) || exec["memory_mb"] != float64(512) || exec["execution_time"] != float64(1500) {
		t.Errorf("payload %s", last.body)
	}
	waitPending(t, d) // the receiver answers before the dispatcher records the success
	off := false
	if _, err := d.Update(h.ID, Patch{Enabled: &off}); err != nil {
		t.Fatal(err)
	}
	d.OnEvent(sandbox.Event{Type: sandbox.EventCreated, SandboxID: "sbx2"})
	if d.Pending() != 0 {
		t.Error("a disabled webhook got a delivery")
	}
}

// TestPendingSurviveRestart: a delivery the receiver has not taken yet is
// in the store; a dispatcher started on it later sends it.
func TestPendingSurviveRestart(t *testing.T) {
	dir := t.TempDir()
	rc := newReceiver(t, 1000) // refuses everything for now
	st := openStore(t, dir)
	d, err := New(st, Options{Backoff: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	d.Start(context.Background())
	if _, err := d.Create(Webhook{URL: rc.srv.URL, Enabled: true, Events: []string{sandbox.EventCreated}}); err != nil {
		t.Fatal(err)
	}
	d.OnEvent(sandbox.Event{Type: sandbox.EventCreated, SandboxID: "sbx1"})
	first := rc.await(t, 1) // tried once, failed, next try in an hour
	d.Close()
	st.Close()

	rc.mu.Lock()
	rc.failFirst = 0
	rc.mu.Unlock()
	st = openStore(t, dir)
	defer st.Close()
	d2, err := New(st, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if d2.Pending() != 1 || len(d2.List()) != 1 {
		t.Fatalf("after the restart: %d pending, %d webhooks; want 1 and 1", d2.Pending(), len(d2.List()))
	}
	// The retry is recorded for an hour from now: make it due, as the
	// clock would.
	for id, dl := range d2.pending {
		dl.NextAt = time.Now()
		d2.pending[id] = dl
	}
	d2.Start(context.Background())
	defer d2.Close()
	got := rc.await(t, 2)
	if string(got[1].body) != string(first[0].body) || got[1].status != 204 {
		t.Errorf("after the restart the receiver got %s (%d), want the same event %s", got[1].body, got[1].status, first[0].body)
	}
	waitPending(t, d2)
}

// TestCrashAfterRecorded: a crash right after a delivery is recorded
// (the fault point fails OnEvent there) loses nothing: the next start
// finds it pending and sends it.
func TestCrashAfterRecorded(t *testing.T) {
	dir := t.TempDir()
	rc := newReceiver(t, 0)
	st := openStore(t, dir)
	d, err := New(st, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Create(Webhook{URL: rc.srv.URL, Enabled: true, Events: []string{sandbox.EventKilled}}); err != nil {
		t.Fatal(err)
	}
	if err := failpoint.Arm("webhooks/delivery/recorded", "error"); err != nil {
		t.Fatal(err)
	}
	d.OnEvent(sandbox.Event{Type: sandbox.EventKilled, SandboxID: "sbx1"})
	if err := failpoint.Arm("webhooks/delivery/recorded", ""); err != nil {
		t.Fatal(err)
	}
	if d.Pending() != 0 {
		t.Fatal("the crashed process went on with the delivery")
	}
	st.Close()

	st = openStore(t, dir)
	defer st.Close()
	d2, err := New(st, Options{})
	if err != nil {
		t.Fatal(err)
	}
	d2.Start(context.Background())
	defer d2.Close()
	got := rc.await(t, 1)
	if !strings.Contains(string(got[0].body), `"sandboxId":"sbx1"`) {
		t.Errorf("after the restart the receiver got %s", got[0].body)
	}
}
