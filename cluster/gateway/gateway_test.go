// The gateway's routing tests run a real scheduler over a real redis-server,
// and fake nodes: httptest servers standing in for aenvd that answer the
// few routes each test needs (the end-to-end test in cluster/e2e runs the
// gateway in front of real aenvd processes).
package gateway

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"github.com/agentenv/agentenv/compose"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/cluster/redistest"
	"github.com/agentenv/agentenv/cluster/schedtest"
	"github.com/agentenv/agentenv/cluster/scheduler"
	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/redis/go-redis/v9"
)

// fakeNode stands in for aenvd: creates (or refuses them for capacity),
// lists with the node's positional tokens, and records what reached it.
type fakeNode struct {
	name   string
	srv    *httptest.Server
	full   bool
	mu     sync.Mutex
	boxes  map[string]time.Time
	hits   []string
	stream chan struct{}
	// templates the node holds; uploaded counts the bytes PUT to them
	templates map[string]bool
	uploaded  int64
	// repo, when set, is the shared repository's paused sandboxes: a
	// connect of one the node does not hold brings it from there
	repo map[string]bool
	// volumes the node holds, by name: their ids
	volumes map[string]string
	// snaps are the node's snapshots, newest first
	snaps []map[string]any
	// resumeDelay is how long a connect that brings a sandbox from repo
	// takes (a real one fetches its state)
	resumeDelay time.Duration
	// events are the node's lifecycle events, oldest first; hooks the ids
	// of its webhooks (events_test.go)
	events []fakeEvent
	hooks  []string
}

func newFakeNode(t *testing.T, name string) *fakeNode {
	f := &fakeNode{name: name, boxes: map[string]time.Time{}, stream: make(chan struct{})}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeNode) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.hits = append(f.hits, r.Method+" "+r.Host+" "+r.URL.Path)
	full := f.full
	f.mu.Unlock()
	if id := proxiedID(r); id != "" && !f.holds(id) {
		writeJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": id, "message": "The sandbox was not found", "code": 502})
		return
	}
	switch {
	case strings.HasPrefix(r.URL.Path, "/events/"):
		f.eventRoutes(w, r)
	case r.Method == "GET" && strings.HasPrefix(r.URL.Path, "/sandboxes/") && !f.holds(sandboxOfPath(r.URL.Path)):
		writeError(w, http.StatusNotFound, "sandbox not found")
	case r.Method == "POST" && (r.URL.Path == "/sandboxes" || r.URL.Path == "/sandboxes-compose"):
		if full {
			w.Header().Set("Retry-After", "5")
			writeError(w, http.StatusServiceUnavailable, "full")
			return
		}
		id := fmt.Sprintf("%s%d", f.name, time.Now().UnixNano())
		f.mu.Lock()
		f.boxes[id] = time.Now()
		f.mu.Unlock()
		writeJSON(w, http.StatusCreated, map[string]string{"sandboxID": id, "templateID": "base"})
	case r.URL.Path == "/v2/sandboxes":
		f.list(w, r)
	case strings.HasPrefix(r.URL.Path, "/volumes"):
		f.volume(w, r)
	case r.URL.Path == "/snapshots" && f.snaps != nil:
		f.listSnaps(w, r)
	case f.repo != nil && r.Method == "POST" && strings.HasSuffix(r.URL.Path, "/connect"):
		f.connect(w, r)
	case r.Method == "GET" && r.URL.Path == "/nodes":
		writeJSON(w, http.StatusOK, []map[string]string{{"nodeID": f.name, "status": "ready"}})
	case r.Method == "GET" && r.URL.Path == "/sandboxes":
		f.mu.Lock()
		out := []map[string]string{}
		for id := range f.boxes {
			out = append(out, map[string]string{"sandboxID": id})
		}
		f.mu.Unlock()
		writeJSON(w, http.StatusOK, out)
	case strings.HasPrefix(r.URL.Path, "/templates/"):
		id, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/templates/"), "/")
		if !f.templates[id] {
			writeError(w, http.StatusNotFound, "no template "+id)
			return
		}
		n, _ := io.Copy(io.Discard, r.Body)
		f.mu.Lock()
		f.uploaded += n
		f.mu.Unlock()
		writeJSON(w, http.StatusOK, map[string]string{"node": f.name, "templateID": id})
	case r.URL.Path == "/stream":
		f.streamLines(w, r)
	case r.URL.Path == "/headers":
		writeJSON(w, http.StatusOK, map[string]string{"acceptEncoding": r.Header.Get("Accept-Encoding")})
	case r.URL.Path == "/ws":
		f.echo(w, r)
	case r.Method == "DELETE":
		w.WriteHeader(http.StatusNoContent)
	default:
		writeJSON(w, http.StatusOK, map[string]string{"node": f.name})
	}
}

// connect resumes a sandbox the node holds or the repository has.
func (f *fakeNode) connect(w http.ResponseWriter, r *http.Request) {
	id := sandboxOfPath(r.URL.Path)
	f.mu.Lock()
	_, held := f.boxes[id]
	delay := f.resumeDelay
	f.mu.Unlock()
	if !held {
		time.Sleep(delay)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.boxes[id]; !ok && !f.repo[id] {
		writeError(w, http.StatusNotFound, "sandbox "+id+" not found")
		return
	}
	f.boxes[id] = time.Now()
	writeJSON(w, http.StatusCreated, map[string]string{"sandboxID": id, "node": f.name})
}

// list pages as aenvd does: descending start time, a token naming the
// position after the last item returned.
func (f *fakeNode) list(w http.ResponseWriter, r *http.Request) {
	limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
	from := ""
	if tok := r.URL.Query().Get("nextToken"); tok != "" {
		b, _ := base64.RawURLEncoding.DecodeString(tok)
		from = string(b)
	}
	type e struct{ key, id string }
	var all []e
	f.mu.Lock()
	for id, at := range f.boxes {
		all = append(all, e{fmt.Sprintf("%020d:%s", int64(1<<62)-at.UnixNano(), id), id})
	}
	started := map[string]time.Time{}
	for id, at := range f.boxes {
		started[id] = at
	}
	f.mu.Unlock()
	sort.Slice(all, func(i, j int) bool { return all[i].key < all[j].key })
	out := []map[string]any{}
	for _, x := range all {
		if from != "" && x.key <= from {
			continue
		}
		if len(out) == limit {
			w.Header().Set("X-Next-Token", base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf("%020d:%s", int64(1<<62)-started[out[len(out)-1]["sandboxID"].(string)].UnixNano(), out[len(out)-1]["sandboxID"]))))
			break
		}
		out = append(out, map[string]any{"sandboxID": x.id, "startedAt": started[x.id]})
	}
	writeJSON(w, http.StatusOK, out)
}

func (f *fakeNode) lastHit() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.hits) == 0 {
		return ""
	}
	return f.hits[len(f.hits)-1]
}

type fixture struct {
	s     *scheduler.Scheduler
	sched pb.SchedulerClient
	gw    *httptest.Server
	nodes []*fakeNode
}

func newFixture(t *testing.T, names ...string) *fixture {
	rs := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	s, err := scheduler.New(scheduler.Options{Redis: rdb, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pb.Dial([]string{schedtest.Serve(t, s).Addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	fx := &fixture{s: s, sched: conn.Client()}
	for _, n := range names {
		f := newFakeNode(t, n)
		fx.nodes = append(fx.nodes, f)
		st := &pb.NodeStatus{Name: n, ApiUrl: f.srv.URL, Capacity: &pb.Resources{CpuCount: 4, MemoryMb: 4096},
			Free: &pb.Resources{CpuCount: 4, MemoryMb: 4096}}
		if _, err := fx.sched.RegisterNode(context.Background(), &pb.RegisterNodeRequest{Status: st}); err != nil {
			t.Fatal(err)
		}
	}
	fx.gw = httptest.NewServer(New(Options{Scheduler: fx.sched, Domain: "sbx.test", LookupTTL: time.Nanosecond, Logger: log}))
	t.Cleanup(fx.gw.Close)
	return fx
}

func (fx *fixture) do(t *testing.T, method, path, host, body string) (int, []byte, http.Header) {
	t.Helper()
	req, _ := http.NewRequest(method, fx.gw.URL+path, strings.NewReader(body))
	if host != "" {
		req.Host = host
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header
}

func (fx *fixture) create(t *testing.T) (string, int) {
	t.Helper()
	code, b, _ := fx.do(t, "POST", "/sandboxes", "", `{"templateID":"base"}`)
	var c created
	_ = json.Unmarshal(b, &c)
	return c.SandboxID, code
}

// TestComposeCreateIsPlaced: a compose create goes to a node like a plain
// create (placed, retried on a full node) with its path kept, and the
// sandbox it answers with is bound there.
func TestComposeCreateIsPlaced(t *testing.T) {
	fx := newFixture(t, "a", "b")
	fx.nodes[0].full = true
	code, b, _ := fx.do(t, "POST", "/sandboxes-compose", "", `{"compose":"services: {}"}`)
	var c created
	if err := json.Unmarshal(b, &c); err != nil || code != http.StatusCreated || !strings.HasPrefix(c.SandboxID, "b") {
		t.Fatalf("compose create with a full: %d %s, want 201 from b", code, b)
	}
	if h := fx.nodes[1].lastHit(); !strings.HasPrefix(h, "POST ") || !strings.HasSuffix(h, " /sandboxes-compose") {
		t.Fatalf("node b last saw %q, want the compose create on its own path", h)
	}
	if code, b, _ := fx.do(t, "POST", "/sandboxes/"+c.SandboxID+"/pause", "", ""); code != 200 || !strings.Contains(string(b), `"node":"b"`) {
		t.Fatalf("a call to the compose sandbox went elsewhere: %d %s", code, b)
	}
}

// TestComposeBodyLimit: a compose create may carry a Compose file of up to
// compose.MaxFileBytes escaped as a JSON string, which the node takes; the
// gateway reads it whole to replay it, so it must take as much, and no
// more, while a plain create keeps its own bound.
func TestComposeBodyLimit(t *testing.T) {
	fx := newFixture(t, "a")
	file := strings.Repeat("\t", compose.MaxFileBytes/2) // a JSON escape per byte of file
	big, _ := json.Marshal(map[string]string{"compose": file})
	if len(big) <= maxBody {
		t.Fatalf("test body of %d bytes is within the plain create's bound", len(big))
	}
	if code, b, _ := fx.do(t, "POST", "/sandboxes-compose", "", string(big)); code != http.StatusCreated {
		t.Fatalf("compose create of %d bytes: %d %s, want it placed", len(big), code, b)
	}
	if code, b, _ := fx.do(t, "POST", "/sandboxes", "", string(big)); code != http.StatusRequestEntityTooLarge {
		t.Fatalf("plain create of %d bytes: %d %s, want 413", len(big), code, b)
	}
	tooBig := `{"compose":"` + strings.Repeat("a", compose.MaxRequestBytes) + `"}`
	if code, b, _ := fx.do(t, "POST", "/sandboxes-compose", "", tooBig); code != http.StatusRequestEntityTooLarge {
		t.Fatalf("compose create of %d bytes: %d %s, want 413", len(tooBig), code, b)
	}
}

func TestCreateRetriesAndRoutes(t *testing.T) {
	fx := newFixture(t, "a", "b")
	fx.nodes[0].full = true // least-loaded picks a first (name order); a refuses
	id, code := fx.create(t)
	if code != http.StatusCreated || !strings.HasPrefix(id, "b") {
		t.Fatalf("create with a full: %d %q, want 201 from b", code, id)
	}
	for _, c := range []struct{ path, host string }{
		{"/sandboxes/" + id, ""},
		{"/sandboxes/" + id + "/pause", ""},
		{"/files", "49983-" + id + ".sbx.test"},
	} {
		if code, b, _ := fx.do(t, "POST", c.path, c.host, ""); code != 200 || !strings.Contains(string(b), `"node":"b"`) {
			t.Fatalf("%s host %q: %d %s, want b's answer", c.path, c.host, code, b)
		}
	}
	req, _ := http.NewRequest("GET", fx.gw.URL+"/process", nil)
	req.Header.Set("E2b-Sandbox-Id", id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := fx.nodes[1].lastHit(); !strings.HasSuffix(got, " /process") {
		t.Fatalf("header-routed request reached b as %q", got)
	}
	fx.nodes[1].full = true
	if _, code := fx.create(t); code != http.StatusServiceUnavailable {
		t.Fatalf("create with every node full: %d, want 503", code)
	}
	if code, _, _ := fx.do(t, "DELETE", "/sandboxes/"+id, "", ""); code != http.StatusNoContent {
		t.Fatalf("kill: %d", code)
	}
	if code, _, _ := fx.do(t, "GET", "/sandboxes/"+id, "", ""); code != http.StatusNotFound {
		t.Fatalf("a killed sandbox: %d, want 404 (unbound)", code)
	}
	for _, p := range []string{"/sandboxes/nope", "/sandboxes/a.b"} {
		if code, _, _ := fx.do(t, "GET", p, "", ""); code != http.StatusNotFound && code != http.StatusBadRequest {
			t.Fatalf("%s: %d, want 404 or 400", p, code)
		}
	}
}

func TestPaginationAcrossNodes(t *testing.T) {
	fx := newFixture(t, "a", "b", "c")
	var all []string
	for range 7 {
		id, code := fx.create(t)
		if code != http.StatusCreated {
			t.Fatalf("create: %d", code)
		}
		all = append(all, id)
	}
	// Newest first across nodes, each exactly once, 3 per page.
	var got []string
	next := ""
	for pages := 0; ; pages++ {
		q := "/v2/sandboxes?limit=3"
		if next != "" {
			q += "&nextToken=" + next
		}
		code, b, h := fx.do(t, "GET", q, "", "")
		var page []struct {
			SandboxID string `json:"sandboxID"`
		}
		if code != 200 || json.Unmarshal(b, &page) != nil || len(page) > 3 {
			t.Fatalf("GET %s: %d %s", q, code, b)
		}
		for _, s := range page {
			got = append(got, s.SandboxID)
		}
		if next = h.Get("X-Next-Token"); next == "" {
			break
		}
		if pages > 5 {
			t.Fatal("pagination does not end")
		}
	}
	want := make([]string, len(all))
	for i, id := range all {
		want[len(all)-1-i] = id
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("paginated list:\n got %v\nwant %v", got, want)
	}
	code, b, _ := fx.do(t, "GET", "/sandboxes", "", "")
	var flat []json.RawMessage
	if code != 200 || json.Unmarshal(b, &flat) != nil || len(flat) != len(all) {
		t.Fatalf("GET /sandboxes across nodes: %d %s, want %d sandboxes", code, b, len(all))
	}
	if code, _, _ := fx.do(t, "GET", "/v2/sandboxes?limit=500", "", ""); code != http.StatusBadRequest {
		t.Fatalf("limit 500: %d, want 400", code)
	}
}

func TestStreamsFlushThrough(t *testing.T) {
	fx := newFixture(t, "a")
	id, code := fx.create(t)
	if code != http.StatusCreated {
		t.Fatal(code)
	}
	req, _ := http.NewRequest("GET", fx.gw.URL+"/stream", nil)
	req.Header.Set("E2b-Sandbox-Id", id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	// The node holds its second line until the first reached the client.
	line, err := rd.ReadString('\n')
	if err != nil || line != "first\n" {
		t.Fatalf("first chunk: %q %v", line, err)
	}
	close(fx.nodes[0].stream)
	if line, err = rd.ReadString('\n'); err != nil || line != "second\n" {
		t.Fatalf("second chunk: %q %v", line, err)
	}
}

// TestCreateUnboundIsFoundByRoster: a create whose binding never happened
// (the gateway died between the node's answer and the bind) is bound by
// the leader from the node's next roster.
func TestCreateUnboundIsFoundByRoster(t *testing.T) {
	fx := newFixture(t, "a")
	if err := failpoint.Arm("gateway/create/created", "error"); err != nil {
		t.Fatal(err)
	}
	id, code := fx.create(t)
	if err := failpoint.Arm("gateway/create/created", ""); err != nil {
		t.Fatal(err)
	}
	if code != http.StatusCreated {
		t.Fatalf("create: %d", code)
	}
	if code, _, _ := fx.do(t, "GET", "/sandboxes/"+id, "", ""); code != http.StatusNotFound {
		t.Fatalf("an unbound sandbox: %d, want 404", code)
	}
	st := &pb.NodeStatus{Name: "a", ApiUrl: fx.nodes[0].srv.URL, Capacity: &pb.Resources{CpuCount: 4, MemoryMb: 4096},
		Free: &pb.Resources{CpuCount: 4, MemoryMb: 4096}, Roster: []*pb.RosterEntry{{SandboxId: id, State: "running"}}}
	if _, err := fx.sched.Heartbeat(context.Background(), &pb.HeartbeatRequest{Status: st}); err != nil {
		t.Fatal(err)
	}
	if err := fx.s.ReconcileOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if code, b, _ := fx.do(t, "GET", "/sandboxes/"+id, "", ""); code != http.StatusOK {
		t.Fatalf("after the roster: %d %s", code, b)
	}
}

// TestTemplateCallsReachTheirNode: a large upload to a template streams to
// the node that holds the template; a GET tries the nodes in turn.
func TestTemplateCallsReachTheirNode(t *testing.T) {
	fx := newFixture(t, "a", "b")
	fx.nodes[1].templates = map[string]bool{"t1": true}
	body := strings.Repeat("x", 3<<20) // larger than any buffered body
	code, b, _ := fx.do(t, "PUT", "/templates/t1/files/abc", "", body)
	if code != http.StatusOK || !strings.Contains(string(b), `"node":"b"`) || fx.nodes[1].uploaded != int64(len(body)) {
		t.Fatalf("upload to t1: %d %s, %d bytes reached b", code, b, fx.nodes[1].uploaded)
	}
	if code, b, _ := fx.do(t, "GET", "/templates/t1", "", ""); code != http.StatusOK || !strings.Contains(string(b), `"node":"b"`) {
		t.Fatalf("GET t1: %d %s", code, b)
	}
	if code, _, _ := fx.do(t, "PUT", "/templates/nope/files/abc", "", "x"); code != http.StatusNotFound {
		t.Fatalf("upload to an unknown template: %d, want 404", code)
	}
}

// TestNodeStatusSetsDrain: POST /nodes/{name} {status} (the request aenvd
// answers for itself) sets and clears the scheduler's drain flag.
func TestNodeStatusSetsDrain(t *testing.T) {
	fx := newFixture(t, "n1", "n2")
	draining := func() bool {
		t.Helper()
		code, b, _ := fx.do(t, "GET", "/nodes/n1", "", "")
		var n struct {
			Status  string      `json:"status"`
			Cluster ClusterInfo `json:"cluster"`
		}
		if code != http.StatusOK || json.Unmarshal(b, &n) != nil {
			t.Fatalf("GET /nodes/n1: %d %s", code, b)
		}
		if (n.Status == "draining") != n.Cluster.Draining {
			t.Fatalf("GET /nodes/n1: status %s, cluster draining %t", n.Status, n.Cluster.Draining)
		}
		return n.Cluster.Draining
	}
	if code, b, _ := fx.do(t, "POST", "/nodes/n1", "", `{"status":"draining"}`); code != http.StatusNoContent || !draining() {
		t.Fatalf("drain n1: %d %s", code, b)
	}
	if code, b, _ := fx.do(t, "POST", "/nodes/n1", "", `{"status":"ready"}`); code != http.StatusNoContent || draining() {
		t.Fatalf("ready n1: %d %s", code, b)
	}
	for _, c := range []struct{ path, body string }{
		{"/nodes/n1", `{"status":"gone"}`},
		{"/nodes/n1", `{"status":`},
	} {
		if code, b, _ := fx.do(t, "POST", c.path, "", c.body); code != http.StatusBadRequest {
			t.Errorf("POST %s %s: %d %s, want 400", c.path, c.body, code, b)
		}
	}
	if code, b, _ := fx.do(t, "POST", "/nodes/nope", "", `{"status":"draining"}`); code != http.StatusNotFound {
		t.Errorf("drain of an unknown node: %d %s, want 404", code, b)
	}
	if code, _, _ := fx.do(t, "POST", "/nodes/n1/drain", "", ""); code != http.StatusNotFound {
		t.Errorf("POST /nodes/n1/drain: %d, want 404 (the status change is POST /nodes/{name})", code)
	}
}
