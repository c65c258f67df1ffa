package gateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
)

// proxiedID is the sandbox a request to the fake node's proxy names (the
// id header, or the host {port}-{id}.sbx.test), "" for its API.
func proxiedID(r *http.Request) string {
	if id := r.Header.Get("E2b-Sandbox-Id"); id != "" {
		return id
	}
	label, ok := strings.CutSuffix(r.Host, ".sbx.test")
	if !ok {
		return ""
	}
	_, id, _ := strings.Cut(label, "-")
	return id
}

func (f *fakeNode) holds(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.boxes[id]
	return ok
}

// streamLines answers two lines, the second only once the test let it
// (after the client read the first): ?type= sets the Content-Type, ?sized
// announces the Content-Length of both lines.
func (f *fakeNode) streamLines(w http.ResponseWriter, r *http.Request) {
	first, second := "first\n", "second\n"
	if ct := r.URL.Query().Get("type"); ct != "" {
		w.Header().Set("Content-Type", ct)
	}
	if r.URL.Query().Has("sized") {
		w.Header().Set("Content-Length", strconv.Itoa(len(first)+len(second)))
	}
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, first)
	w.(http.Flusher).Flush()
	<-f.stream
	_, _ = io.WriteString(w, second)
}

// echo takes a connection upgrade and echoes lines on it, as a WebSocket
// server would its frames.
func (f *fakeNode) echo(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Upgrade") != "websocket" {
		writeError(w, http.StatusBadRequest, "not an upgrade")
		return
	}
	conn, rw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	_, _ = rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	_ = rw.Flush()
	for {
		line, err := rw.ReadString('\n')
		if err != nil {
			return
		}
		_, _ = rw.WriteString("echo " + line)
		_ = rw.Flush()
	}
}

// connectEnvelope is one message of a Connect stream: flags, big-endian
// length, payload.
func connectEnvelope(flags byte, payload string) []byte {
	b := make([]byte, 5, 5+len(payload))
	b[0] = flags
	binary.BigEndian.PutUint32(b[1:], uint32(len(payload)))
	return append(b, payload...)
}

// TestStreamsFlushPerMessage: every kind of stream a sandbox answers
// reaches the client message by message through the gateway, the node
// holding its next message until the client read the one before (a
// gateway that buffered would hang here): Server-Sent Events, a Connect
// stream (the agent's process and watch calls), a chunked answer of no
// declared type, and an answer with its Content-Length written in parts.
func TestStreamsFlushPerMessage(t *testing.T) {
	fx := newFixture(t, "a")
	id, code := fx.create(t)
	if code != http.StatusCreated {
		t.Fatal(code)
	}
	for _, q := range []string{"type=text/event-stream", "type=application/connect%2Bjson", "", "sized"} {
		req, _ := http.NewRequest("GET", fx.gw.URL+"/stream?"+q, nil)
		req.Header.Set("E2b-Sandbox-Id", id)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		rd := bufio.NewReader(resp.Body)
		if line, err := rd.ReadString('\n'); err != nil || line != "first\n" {
			t.Fatalf("%s: first message %q %v", q, line, err)
		}
		fx.nodes[0].stream <- struct{}{}
		if rest, err := io.ReadAll(rd); err != nil || string(rest) != "second\n" {
			t.Fatalf("%s: second message %q %v", q, rest, err)
		}
		resp.Body.Close()
	}
}

// TestConnectStreamThroughGateway: a Connect server stream's envelopes
// arrive one at a time and intact, the end-of-stream message last.
func TestConnectStreamThroughGateway(t *testing.T) {
	fx := newFixture(t, "a")
	id, code := fx.create(t)
	if code != http.StatusCreated {
		t.Fatal(code)
	}
	release := make(chan struct{})
	node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/connect+json")
		for i := range 3 {
			_, _ = w.Write(connectEnvelope(0, fmt.Sprintf(`{"event":%d}`, i)))
			w.(http.Flusher).Flush()
			<-release
		}
		_, _ = w.Write(connectEnvelope(2, `{}`))
	}))
	defer node.Close()
	// The sandbox's node is this one now.
	st := &pb.NodeStatus{Name: "c", ApiUrl: node.URL, Capacity: &pb.Resources{CpuCount: 4, MemoryMb: 4096},
		Free: &pb.Resources{CpuCount: 4, MemoryMb: 4096}}
	ctx := context.Background()
	if _, err := fx.sched.RegisterNode(ctx, &pb.RegisterNodeRequest{Status: st}); err != nil {
		t.Fatal(err)
	}
	if _, err := fx.sched.Bind(ctx, &pb.BindRequest{SandboxId: id, Node: "c"}); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("POST", fx.gw.URL+"/process.Process/Start", bytes.NewReader(connectEnvelope(0, `{}`)))
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("Content-Type", "application/connect+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	for i := range 4 {
		hdr := make([]byte, 5)
		if _, err := io.ReadFull(resp.Body, hdr); err != nil {
			t.Fatalf("envelope %d: %v", i, err)
		}
		msg := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
		if _, err := io.ReadFull(resp.Body, msg); err != nil {
			t.Fatalf("envelope %d: %v", i, err)
		}
		want, flags := fmt.Sprintf(`{"event":%d}`, i), byte(0)
		if i == 3 {
			want, flags = `{}`, 2
		}
		if hdr[0] != flags || string(msg) != want {
			t.Fatalf("envelope %d: flags %d %q, want %d %q", i, hdr[0], msg, flags, want)
		}
		if i < 3 {
			release <- struct{}{}
		}
	}
}

// TestWebSocketUpgradeThroughGateway: an upgrade reaches the node and the
// connection carries traffic both ways afterwards.
func TestWebSocketUpgradeThroughGateway(t *testing.T) {
	fx := newFixture(t, "a")
	id, code := fx.create(t)
	if code != http.StatusCreated {
		t.Fatal(code)
	}
	conn, err := net.Dial("tcp", strings.TrimPrefix(fx.gw.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: 49983-%s.sbx.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", id)
	rd := bufio.NewReader(conn)
	resp, err := http.ReadResponse(rd, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade through the gateway: %v %v, want 101", resp, err)
	}
	for _, msg := range []string{"hello\n", "again\n"} {
		if _, err := io.WriteString(conn, msg); err != nil {
			t.Fatal(err)
		}
		if got, err := rd.ReadString('\n'); err != nil || got != "echo "+msg {
			t.Fatalf("echo of %q: %q %v", msg, got, err)
		}
	}
}

// move rebinds sandbox id from one fake node to another, as a resume on
// another node through another gateway replica does.
func (fx *fixture) move(t *testing.T, id string, from, to *fakeNode) {
	t.Helper()
	from.mu.Lock()
	delete(from.boxes, id)
	from.mu.Unlock()
	to.mu.Lock()
	to.boxes[id] = time.Now()
	to.mu.Unlock()
	if _, err := fx.sched.Bind(context.Background(), &pb.BindRequest{SandboxId: id, Node: to.name}); err != nil {
		t.Fatal(err)
	}
}

func (f *fakeNode) hitCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.hits)
}

// TestStaleLookupCorrected: a gateway that remembers a sandbox's node for
// an hour still follows the sandbox when it moves: the old node's "not
// here" (its proxy's 502, its API's 404) drops the cached node, a request
// without a body is replayed on the new node at once, one with a body gets
// the old node's answer (it may not be sent twice) and the next goes to the
// new node.
func TestStaleLookupCorrected(t *testing.T) {
	fx := newFixture(t, "a", "b")
	a, b := fx.nodes[0], fx.nodes[1]
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	gw := httptest.NewServer(New(Options{Scheduler: fx.sched, Domain: "sbx.test", LookupTTL: time.Hour, Logger: log}))
	defer gw.Close()
	fx.gw = gw
	id, code := fx.create(t) // bound, and remembered, on a
	if code != http.StatusCreated || !strings.HasPrefix(id, "a") {
		t.Fatalf("create: %d %q, want on a", code, id)
	}
	host := "49983-" + id + ".sbx.test"
	if code, body, _ := fx.do(t, "GET", "/files", host, ""); code != 200 || !strings.Contains(string(body), `"node":"a"`) {
		t.Fatalf("before the move: %d %s", code, body)
	}

	fx.move(t, id, a, b)
	hitsA := a.hitCount()
	if code, body, _ := fx.do(t, "GET", "/files", host, ""); code != 200 || !strings.Contains(string(body), `"node":"b"`) {
		t.Fatalf("GET after the move: %d %s, want b's answer", code, body)
	}
	if a.hitCount() != hitsA+1 {
		t.Fatalf("the stale node got %d requests, want the 1 that found the sandbox gone", a.hitCount()-hitsA)
	}
	if code, body, _ := fx.do(t, "GET", "/files", host, ""); code != 200 || !strings.Contains(string(body), `"node":"b"`) || a.hitCount() != hitsA+1 {
		t.Fatalf("the next GET: %d %s (a got %d more), want b's answer straight", code, body, a.hitCount()-hitsA-1)
	}

	fx.move(t, id, b, a) // the API's 404 says the same
	if code, body, _ := fx.do(t, "GET", "/sandboxes/"+id, "", ""); code != 200 || !strings.Contains(string(body), `"node":"a"`) {
		t.Fatalf("GET /sandboxes/{id} after the move back: %d %s, want a's answer", code, body)
	}

	fx.move(t, id, a, b)
	hitsB := b.hitCount()
	if code, _, _ := fx.do(t, "POST", "/files", host, "data"); code != http.StatusBadGateway || b.hitCount() != hitsB {
		t.Fatalf("POST with a body after the move: %d (b got %d requests), want a's 502 and no replay", code, b.hitCount()-hitsB)
	}
	if code, body, _ := fx.do(t, "POST", "/files", host, "data"); code != 200 || !strings.Contains(string(body), `"node":"b"`) {
		t.Fatalf("the next POST: %d %s, want b's answer", code, body)
	}
}

// TestEncodingPassesAsAsked: the node sees the client's Accept-Encoding,
// none added (the gateway does not ask the node for gzip to inflate it).
func TestEncodingPassesAsAsked(t *testing.T) {
	fx := newFixture(t, "a")
	id, code := fx.create(t)
	if code != http.StatusCreated {
		t.Fatal(code)
	}
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	defer client.CloseIdleConnections()
	for _, enc := range []string{"", "br"} {
		req, _ := http.NewRequest("GET", fx.gw.URL+"/headers", nil)
		req.Header.Set("E2b-Sandbox-Id", id)
		if enc != "" {
			req.Header.Set("Accept-Encoding", enc)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			AcceptEncoding string `json:"acceptEncoding"`
		}
		err = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if err != nil || got.AcceptEncoding != enc {
			t.Fatalf("client's Accept-Encoding %q reached the node as %q (%v)", enc, got.AcceptEncoding, err)
		}
	}
}
