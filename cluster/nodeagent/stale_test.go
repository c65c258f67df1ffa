package nodeagent

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/cluster/scheduler"
	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
)

// syncBuffer is a log sink the test reads while the agent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// testClock is the scheduler's clock, moved by the test only.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *testClock) Add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// TestAgentDropsStaleCopies: a revived node whose roster holds sandboxes
// another live node holds (bound there, in its roster) removes its copies
// when the scheduler names them, a paused one and a running one (a split
// brain, logged as a warning), and keeps its own.
func TestAgentDropsStaleCopies(t *testing.T) {
	logs := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(io.MultiWriter(t.Output(), logs), nil))
	clk := &testClock{t: time.Now()}
	served := startScheduler(t, log, func(o *scheduler.Options) { o.HeartbeatInterval, o.Now = 50*time.Millisecond, clk.Now })
	c := served.Client
	ctx := context.Background()

	// n2 holds the two sandboxes resumed there; their bindings settle.
	n2 := &pb.NodeStatus{Name: "n2", ApiUrl: "http://n2.invalid:3000", Capacity: &pb.Resources{CpuCount: 4, MemoryMb: 4096}}
	for _, id := range []string{"moved", "split"} {
		n2.Roster = append(n2.Roster, &pb.RosterEntry{SandboxId: id, State: "running"})
	}
	if _, err := c.RegisterNode(ctx, &pb.RegisterNodeRequest{Status: n2}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"moved", "split"} {
		if _, err := c.Bind(ctx, &pb.BindRequest{SandboxId: id, Node: "n2"}); err != nil {
			t.Fatal(err)
		}
	}
	clk.Add(time.Second) // past the roster grace (2 heartbeats), within DownAfter of n2's next heartbeat
	if _, err := c.Heartbeat(ctx, &pb.HeartbeatRequest{Status: n2}); err != nil {
		t.Fatal(err)
	}

	src := &fixedSource{u: Usage{CPUs: 4, FreeCPUs: 4, MemoryMB: 4096, FreeMemoryMB: 4096, Roster: []Sandbox{
		{ID: "moved", State: "paused"}, {ID: "split", State: "running"}, {ID: "mine", State: "paused"}}}}
	a, err := New(Options{Schedulers: []string{served.Addr}, Name: "n1", APIURL: "http://127.0.0.1:1",
		Source: src, Logger: log, RetryInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	actx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(actx) }()

	// Ready comes after the first answer and the removals it asked for:
	// from then on the node serves no stale copy.
	select {
	case <-a.Ready():
	case <-time.After(10 * time.Second):
		t.Fatalf("the agent is not ready 10s after its start (dropped %v)", src.droppedIDs())
	}
	if got := src.droppedIDs(); !slices.Equal(slices.Sorted(slices.Values(got)), []string{"moved", "split"}) {
		t.Fatalf("dropped %v when ready, want moved and split (and never mine)", got)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if u := src.Usage(); len(u.Roster) != 1 || u.Roster[0].ID != "mine" {
		t.Fatalf("roster after the drops: %v, want mine alone", u.Roster)
	}
	out := logs.String()
	for _, want := range []string{"msg=\"removed stale copy of a sandbox resumed on another node\" node=n1 sandbox=moved state=paused",
		"level=WARN msg=\"split brain: killed a running copy of a sandbox bound to another node\" node=n1 sandbox=split"} {
		if !strings.Contains(out, want) {
			t.Fatalf("log lacks %q:\n%s", want, out)
		}
	}
	r, err := c.LookupNode(ctx, &pb.LookupNodeRequest{SandboxId: "moved"})
	if err != nil || r.GetNode().GetStatus().GetName() != "n2" {
		t.Fatalf("moved after n1 dropped its copy: %v (err %v), want still on n2", r, err)
	}
}
