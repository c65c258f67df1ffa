package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/agentenv/agentenv/cluster/nodeagent"
)

func TestAdvertiseAddr(t *testing.T) {
	if got := advertiseAddr("10.1.2.3:3000", "aenv"); got != "10.1.2.3:3000" {
		t.Fatalf("a specific listen address: %q", got)
	}
	got := advertiseAddr("0.0.0.0:3000", "aenv")
	host, port, err := net.SplitHostPort(got)
	if err != nil || port != "3000" {
		t.Fatalf("advertise of 0.0.0.0:3000: %q (%v)", got, err)
	}
	ip := net.ParseIP(host)
	if ip == nil || ip.IsLoopback() || (ip.IsUnspecified() && hasIPv4(t)) {
		t.Fatalf("advertise of 0.0.0.0:3000: %q, want the host's first IPv4 address", got)
	}
}

// hasIPv4 reports whether some interface but loopback has an IPv4 address.
func hasIPv4(t *testing.T) bool {
	ifs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	for _, ifc := range ifs {
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && ifc.Flags&net.FlagUp != 0 {
				return true
			}
		}
	}
	return false
}

// TestHoldUntilOpen: a starting cluster node holds every request but the
// passed paths until its gate opens, and a client that gives up meanwhile
// gets nothing from the handler.
func TestHoldUntilOpen(t *testing.T) {
	open := make(chan struct{})
	served := make(chan string, 4)
	h := holdUntil(open, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served <- r.URL.Path
	}), "/health")
	srv := httptest.NewServer(h)
	defer srv.Close()

	if resp, err := http.Get(srv.URL + "/health"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/health while held: %v %v", resp, err)
	}
	if got := <-served; got != "/health" {
		t.Fatalf("served %q, want /health", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/sandboxes/gone", nil)
	if _, err := http.DefaultClient.Do(req); err == nil {
		t.Fatal("a sandbox request was answered while the gate was closed")
	}
	held := make(chan error, 1)
	go func() {
		resp, err := http.Get(srv.URL + "/sandboxes/x")
		if err == nil {
			resp.Body.Close()
		}
		held <- err
	}()
	select {
	case err := <-held:
		t.Fatalf("answered before the gate opened (%v)", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(open)
	if err := <-held; err != nil {
		t.Fatal(err)
	}
	if got := <-served; got != "/sandboxes/x" {
		t.Fatalf("served %q after the gate opened, want /sandboxes/x", got)
	}
	select {
	case got := <-served:
		t.Fatalf("the request whose client gave up was served: %q", got)
	default:
	}
}

// TestGateOpensWithoutScheduler: a node whose scheduler never answers
// serves after the bounded wait (and says so), instead of never.
func TestGateOpensWithoutScheduler(t *testing.T) {
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := dead.Addr().String()
	dead.Close()
	m := &clusterMember{open: make(chan struct{}), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if m.agent, err = nodeagent.New(nodeagent.Options{Schedulers: []string{addr}, Name: "n", APIURL: "http://127.0.0.1:1", Source: noSource{}}); err != nil {
		t.Fatal(err)
	}
	defer m.agent.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = m.agent.Run(ctx) }()
	go m.openWhenReady(ctx, 200*time.Millisecond)
	select {
	case <-m.open:
	case <-time.After(10 * time.Second):
		t.Fatal("the gate stays closed without a scheduler")
	}
	select {
	case <-m.agent.Ready():
		t.Fatal("the agent says ready without any scheduler answer")
	default:
	}
	var nilMember *clusterMember
	if h := http.NotFoundHandler(); nilMember.gate(h) == nil {
		t.Fatal("a node outside a cluster has no handler")
	}
}

type noSource struct{}

func (noSource) Usage() nodeagent.Usage                           { return nodeagent.Usage{} }
func (noSource) DropCopy(context.Context, string) (string, error) { return "", nil }
