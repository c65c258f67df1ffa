package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/admission"
	"github.com/agentenv/agentenv/disk/disktest"
	"github.com/agentenv/agentenv/sandbox"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/orchestrator"
	"github.com/agentenv/agentenv/store"
)

const testKey = "e2b_0123456789abcdef0123456789abcdef01234567"

// newTestHandler serves the API over an orchestrator with no templates and
// no VMM: every request is answered without starting a VM.
func newTestHandler(t testing.TB) http.Handler {
	t.Helper()
	return NewHandler(testOptions(t))
}

// testOptions are a handler's options over a real store and an orchestrator
// with no templates and no VMM, for node node1; tests add what they need.
func testOptions(t testing.TB) Options {
	t.Helper()
	dir := t.TempDir()
	st := testStore(t, dir)
	o, err := orchestrator.New(t.Context(), orchestrator.Options{DataDir: dir, Store: st, Storage: disktest.Devices(t)})
	if err != nil {
		t.Fatal(err)
	}
	return Options{Orchestrator: o, Store: st, APIKey: testKey, DefaultTimeout: 15 * time.Second, MaxTimeout: time.Hour,
		Node: NodeInfo{ID: "node1"}}
}

func do(h http.Handler, method, path, key, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	if key != "" {
		r.Header.Set("X-API-Key", key)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// checkError asserts the {"code": status, "message": ...} body of an error.
func checkError(t testing.TB, w *httptest.ResponseRecorder) {
	t.Helper()
	if w.Code < 400 {
		return
	}
	var e wire.Error
	if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || int(e.Code) != w.Code || e.Message == "" {
		t.Fatalf("status %d: body %q is not {\"code\": %d, \"message\": ...}", w.Code, w.Body.String(), w.Code)
	}
}

func TestStatusesWithoutVMs(t *testing.T) {
	h := newTestHandler(t)
	cases := []struct {
		method, path, key, body string
		want                    int
	}{
		{"GET", "/health", "", "", 204},
		{"GET", "/metrics", "", "", 404}, // no registry given
		{"GET", "/sandboxes", "", "", 401},
		{"GET", "/sandboxes", "e2b_nope", "", 401},
		{"GET", "/sandboxes", testKey, "", 200},
		{"GET", "/v2/sandboxes?state=running,paused&limit=5", testKey, "", 200},
		{"GET", "/v2/sandboxes?limit=101", testKey, "", 400},
		{"GET", "/v2/sandboxes?metadata=%25zz", testKey, "", 400},
		{"POST", "/sandboxes", testKey, `{"templateID":"base"}`, 404},
		{"POST", "/v2/sandboxes", testKey, `{"templateID":"base","timeout":999999}`, 400},
		{"POST", "/sandboxes", testKey, `{"templateID":`, 400},
		{"POST", "/sandboxes", testKey, `{}`, 400},
		{"POST", "/sandboxes", testKey, `{"templateID":"base","autoPause":true,"autoPauseMemory":false,"autoResume":{"enabled":true}}`, 400},
		{"POST", "/v2/sandboxes", testKey, `{"templateID":"base","autoPause":true,"autoPauseMemory":false,"autoResume":{"enabled":true}}`, 400},
		{"POST", "/sandboxes", testKey, `{"templateID":"base","autoPause":true,"autoPauseMemory":false}`, 404},
		{"DELETE", "/sandboxes/abc", testKey, "", 404},
		{"POST", "/sandboxes/abc/pause", testKey, "", 404},
		{"POST", "/sandboxes/abc/pause", testKey, "{", 400},
		{"POST", "/sandboxes/abc/pause", testKey, `{"memory":"no"}`, 400},
		{"POST", "/sandboxes/abc/pause", testKey, `{"memory":false}`, 404},
		{"POST", "/v2/sandboxes/abc/connect", testKey, `{"memory":false}`, 404},
		{"POST", "/sandboxes/abc/connect", testKey, `{"timeout":10}`, 404},
		{"POST", "/v2/sandboxes/abc/connect", testKey, `{}`, 404},
		{"POST", "/sandboxes/abc/resume", testKey, `{}`, 404},
		{"POST", "/sandboxes/abc/timeout", testKey, `{"timeout":10}`, 404},
		{"POST", "/sandboxes/abc/refreshes", testKey, `{"duration":4000}`, 400},
		{"PUT", "/sandboxes/abc/network", testKey, `{"denyOut":["10.0.0.0/8"]}`, 404},
		{"GET", "/sandboxes/abc/metrics", testKey, "", 404},
		{"GET", "/templates", testKey, "", 200},
		{"GET", "/templates/base", testKey, "", 404},
		{"GET", "/nodes", testKey, "", 200},
		{"GET", "/nodes/node1", testKey, "", 200},
		{"GET", "/nodes/other", testKey, "", 404},
		{"GET", "/no/such/route", testKey, "", 404},
		{"PATCH", "/sandboxes", testKey, "", 405},
	}
	for _, c := range cases {
		w := do(h, c.method, c.path, c.key, c.body)
		if w.Code != c.want {
			t.Errorf("%s %s %q: status %d, want %d (%s)", c.method, c.path, c.body, w.Code, c.want, w.Body.String())
			continue
		}
		checkError(t, w)
	}
}

// FuzzAPI sends arbitrary requests: the server never panics, never answers
// 5xx without a VM involved, and every error has the E2B error shape.
func FuzzAPI(f *testing.F) {
	for _, s := range []struct{ m, p, b string }{
		{"POST", "/sandboxes", `{"templateID":"base","metadata":{"a":"b"},"envVars":{"X":"1"},"timeout":10}`},
		{"POST", "/v2/sandboxes", `{"templateID":"x","autoResume":{"enabled":true},"network":{"allowOut":["*.example.com"]}}`},
		{"GET", "/v2/sandboxes?metadata=a%3Db&state=paused&nextToken=MDA6YQ&limit=3", ""},
		{"PUT", "/sandboxes/x/network", `{"allowOut":["1.2.3.4/33"]}`},
		{"POST", "/sandboxes/x/timeout", `{"timeout":-1}`},
		{"GET", "/templates/%00", ""},
	} {
		f.Add(s.m, s.p, s.b, true)
	}
	h := newTestHandler(f)
	methods := map[string]bool{"GET": true, "POST": true, "PUT": true, "DELETE": true, "PATCH": true}
	f.Fuzz(func(t *testing.T, method, path, body string, auth bool) {
		if !methods[method] || !strings.HasPrefix(path, "/") || strings.ContainsAny(path, " \r\n\t#") {
			return
		}
		key := ""
		if auth {
			key = testKey
		}
		r, err := http.NewRequest(method, "http://node"+path, io.NopCloser(bytes.NewReader([]byte(body))))
		if err != nil {
			return
		}
		r.Header.Set("X-API-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code >= 500 {
			t.Fatalf("%s %s %q: status %d: %s", method, path, body, w.Code, w.Body.String())
		}
		checkError(t, w)
	})
}

func TestPaginationCursorOrder(t *testing.T) {
	now := time.Now()
	newer := sandbox.Record{ID: "b", StartedAt: now}
	older := sandbox.Record{ID: "a", StartedAt: now.Add(-time.Second)}
	sameTimeLaterID := sandbox.Record{ID: "c", StartedAt: now}
	if !(cursor(newer) < cursor(sameTimeLaterID) && cursor(sameTimeLaterID) < cursor(older)) {
		t.Fatalf("cursor order does not follow List order (newest first, then id): %q %q %q",
			cursor(newer), cursor(sameTimeLaterID), cursor(older))
	}
	md, err := parseMetadata(ptr("user=alice&team=a%26b"))
	if err != nil || md["user"] != "alice" || md["team"] != "a&b" {
		t.Fatalf("parseMetadata: %v %v", md, err)
	}
}

func TestCreateTimeoutDefaults(t *testing.T) {
	t.Parallel()
	s := &Server{opts: Options{DefaultTimeout: 15 * time.Second, MaxTimeout: time.Hour}}
	cases := []struct {
		secs *int32
		v2   bool
		want time.Duration
		ok   bool
	}{
		{nil, false, 15 * time.Second, true},
		{nil, true, 300 * time.Second, true},
		{ptr(int32(0)), true, 300 * time.Second, true},
		{ptr(int32(40)), true, 40 * time.Second, true},
		{ptr(int32(40)), false, 40 * time.Second, true},
		{ptr(int32(-1)), false, 0, false},
		{ptr(int32(7200)), true, 0, false},
	}
	for _, c := range cases {
		w := httptest.NewRecorder()
		got, ok := s.createTimeout(w, c.secs, c.v2)
		if got != c.want || ok != c.ok {
			t.Errorf("createTimeout(%v, v2=%v) = %s, %v; want %s, %v", c.secs, c.v2, got, ok, c.want, c.ok)
		}
		if !ok && w.Code != http.StatusBadRequest {
			t.Errorf("refused timeout answered %d", w.Code)
		}
	}
	short := &Server{opts: Options{DefaultTimeout: 15 * time.Second, MaxTimeout: time.Minute}}
	if got, _ := short.createTimeout(httptest.NewRecorder(), nil, true); got != time.Minute {
		t.Errorf("v2 default above the maximum: %s, want the maximum", got)
	}
}

// TestSandboxDetailNetwork: GET /sandboxes/{id} reports the sandbox's egress
// policy and whether its public traffic needs a token.
func TestSandboxDetailNetwork(t *testing.T) {
	dir := t.TempDir()
	st := testStore(t, dir)
	recs := []sandbox.Record{
		{ID: "sbxlocked", TemplateID: "base", State: sandbox.Paused, Snapshot: filepath.Join(dir, "s1"), TrafficToken: "tok",
			Policy: network.Policy{DenyInternet: true, AllowOut: []string{"10.1.2.3", "example.com"}, DenyOut: []string{"8.8.8.8/32"}}},
		{ID: "sbxopen", TemplateID: "base", State: sandbox.Paused, Snapshot: filepath.Join(dir, "s2")},
	}
	for _, r := range recs {
		if err := os.MkdirAll(r.Snapshot, 0o755); err != nil { // a paused sandbox's snapshot
			t.Fatal(err)
		}
		if err := st.Put(store.Sandboxes, r.ID, r); err != nil {
			t.Fatal(err)
		}
	}
	o, err := orchestrator.New(t.Context(), orchestrator.Options{DataDir: dir, Store: st, Storage: disktest.Devices(t)})
	if err != nil {
		t.Fatal(err)
	}
	h := NewHandler(Options{Orchestrator: o, APIKey: testKey, DefaultTimeout: 15 * time.Second, MaxTimeout: time.Hour})
	get := func(id string) wire.SandboxDetail {
		w := do(h, "GET", "/sandboxes/"+id, testKey, "")
		if w.Code != 200 {
			t.Fatalf("GET %s: %d %s", id, w.Code, w.Body)
		}
		var d wire.SandboxDetail
		if err := json.Unmarshal(w.Body.Bytes(), &d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	d := get("sbxlocked")
	if d.AllowInternetAccess == nil || *d.AllowInternetAccess || d.Network == nil ||
		d.Network.AllowPublicTraffic == nil || *d.Network.AllowPublicTraffic ||
		d.Network.AllowOut == nil || strings.Join(*d.Network.AllowOut, ",") != "10.1.2.3,example.com" ||
		d.Network.DenyOut == nil || strings.Join(*d.Network.DenyOut, ",") != "8.8.8.8/32" {
		t.Fatalf("locked sandbox detail: %+v network %+v", d, d.Network)
	}
	d = get("sbxopen")
	if d.AllowInternetAccess == nil || !*d.AllowInternetAccess || d.Network == nil || !*d.Network.AllowPublicTraffic ||
		d.Network.AllowOut != nil || d.Network.DenyOut != nil {
		t.Fatalf("open sandbox detail: %+v network %+v", d, d.Network)
	}
}

// TestMetricsRoute: GET /metrics serves the given handler without an API key.
func TestMetricsRoute(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	st := testStore(t, dir)
	o, err := orchestrator.New(t.Context(), orchestrator.Options{DataDir: dir, Store: st, Storage: disktest.Devices(t)})
	if err != nil {
		t.Fatal(err)
	}
	metrics := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "aenvd_up 1\n") })
	h := NewHandler(Options{Orchestrator: o, APIKey: testKey, DefaultTimeout: time.Second, MaxTimeout: time.Hour, Metrics: metrics})
	w := do(h, "GET", "/metrics", "", "")
	if w.Code != 200 || w.Body.String() != "aenvd_up 1\n" {
		t.Fatalf("GET /metrics: %d %q", w.Code, w.Body)
	}
	if w := do(h, "POST", "/metrics", "", ""); w.Code != http.StatusMethodNotAllowed && w.Code != http.StatusUnauthorized {
		t.Fatalf("POST /metrics: %d", w.Code)
	}
}

// TestErrorVocabulary: the orchestrator's errors map to one status each,
// whatever wraps them; a lower layer's own "invalid" is not a client error.
func TestErrorVocabulary(t *testing.T) {
	cases := []struct {
		err  error
		want int
	}{
		{fmt.Errorf("sandbox x: %w", orchestrator.ErrNotFound), http.StatusNotFound},
		{fmt.Errorf("pause: %w", orchestrator.ErrConflict), http.StatusConflict},
		{fmt.Errorf("create: %w", orchestrator.ErrInvalid), http.StatusBadRequest},
		{fmt.Errorf("network slot: %w: %w", errors.New("no free slot index"), orchestrator.ErrCapacity), http.StatusServiceUnavailable},
		{fmt.Errorf("rootfs device: %w", errors.New("storaged: invalid request")), http.StatusInternalServerError},
	}
	for _, c := range cases {
		if got := statusOf(c.err); got != c.want {
			t.Errorf("statusOf(%v) = %d, want %d", c.err, got, c.want)
		}
	}
	rec := httptest.NewRecorder()
	(&Server{log: slog.Default()}).fail(rec, httptest.NewRequest("POST", "/sandboxes", nil), fmt.Errorf("x: %w", orchestrator.ErrCapacity))
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("capacity error answered %d with Retry-After %q", rec.Code, rec.Header().Get("Retry-After"))
	}
	// An admission refusal: a count limit is 429, its Retry-After the
	// refusal's own, its message the limit and the numbers.
	ctl := admission.New(admission.Limits{MaxSandboxes: 1, RetryAfter: 1500 * time.Millisecond})
	_, err := ctl.Admit(context.Background(), admission.Request{Op: "create", Sandboxes: 1},
		func() admission.Usage { return admission.Usage{Sandboxes: 1} })
	rec = httptest.NewRecorder()
	(&Server{log: slog.Default()}).fail(rec, httptest.NewRequest("POST", "/sandboxes", nil), fmt.Errorf("create sandbox: %w", err))
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "2" ||
		!strings.Contains(rec.Body.String(), "max_sandboxes") {
		t.Fatalf("count refusal answered %d, Retry-After %q, body %s", rec.Code, rec.Header().Get("Retry-After"), rec.Body)
	}
}

// testStore opens the node's store in dir for one test.
func testStore(t testing.TB, dir string) *store.Store {
	t.Helper()
	st, err := store.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}
