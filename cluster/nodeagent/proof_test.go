package nodeagent

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/agentenv/agentenv/cluster/scheduler"
	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
	"github.com/agentenv/agentenv/internal/testutil/netcut"
)

// vouch is Vouch with a bound on the wait.
func vouch(a *Agent, id string, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	return a.Vouch(ctx, id)
}

// A node answers for its sandboxes only while it proves it owns them: the
// scheduler named them bound here (or bound nowhere yet) within the lease,
// or they are newer than the roster it answered. A sandbox bound to another
// node is refused at once; cut off from the scheduler (a real partition of
// the gRPC connection), the node proves nothing once the lease ran out and
// requests wait, then are refused; healed, the next answer proves again and
// a waiting request goes on. Real Redis, scheduler over gRPC.
func TestVouchFollowsTheScheduler(t *testing.T) {
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	clk := &testClock{t: time.Now()}
	served := startScheduler(t, log, func(o *scheduler.Options) {
		o.HeartbeatInterval, o.DownAfter, o.Now = 50*time.Millisecond, 400*time.Millisecond, clk.Now
	})
	c, ctx := served.Client, context.Background()
	// n2 holds "moved", resumed there; its binding settles.
	n2 := &pb.NodeStatus{Name: "n2", ApiUrl: "http://n2.invalid:3000", Capacity: &pb.Resources{CpuCount: 4, MemoryMb: 4096},
		Roster: []*pb.RosterEntry{{SandboxId: "moved", State: "running"}}}
	if _, err := c.RegisterNode(ctx, &pb.RegisterNodeRequest{Status: n2}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Bind(ctx, &pb.BindRequest{SandboxId: "moved", Node: "n2"}); err != nil {
		t.Fatal(err)
	}
	clk.Add(time.Second) // past the roster grace; the scheduler's clock stays put from here (no node goes down)
	if _, err := c.Heartbeat(ctx, &pb.HeartbeatRequest{Status: n2}); err != nil {
		t.Fatal(err)
	}

	link, err := netcut.Listen(served.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer link.Close()
	src := &fixedSource{u: Usage{CPUs: 4, FreeCPUs: 4, MemoryMB: 4096, FreeMemoryMB: 4096, Roster: []Sandbox{
		{ID: "mine", State: "running"}, {ID: "moved", State: "paused"}}}}
	a, err := New(Options{Schedulers: []string{link.Addr()}, Name: "n1", APIURL: "http://127.0.0.1:1",
		Source: src, Logger: log, RetryInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	actx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- a.Run(actx) }()
	defer func() { cancel(); <-done }()
	select {
	case <-a.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("the agent is not ready 10s after its start")
	}
	if err := vouch(a, "mine", 5*time.Second); err != nil {
		t.Fatalf("a sandbox reported here and bound nowhere: %v", err)
	}
	if err := vouch(a, "moved", 5*time.Second); !errors.Is(err, ErrMoved) {
		t.Fatalf("a sandbox bound to n2: %v, want ErrMoved", err)
	}
	if err := vouch(a, "fresh", 5*time.Second); err != nil {
		t.Fatalf("a sandbox newer than the answered roster, within the lease: %v", err)
	}

	link.Cut()
	// The lease (200ms) runs out within a few heartbeats of the cut.
	deadline := time.Now().Add(10 * time.Second)
	for vouch(a, "mine", 10*time.Millisecond) == nil {
		if time.Now().After(deadline) {
			t.Fatal("the node still proves it owns mine 10s into the partition")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, id := range []string{"mine", "fresh"} {
		if err := vouch(a, id, 300*time.Millisecond); !errors.Is(err, ErrUnproven) {
			t.Fatalf("%s with the scheduler cut off: %v, want ErrUnproven", id, err)
		}
	}

	waited := make(chan error, 1)
	go func() { waited <- vouch(a, "mine", time.Minute) }() // waits across the heal
	link.Restore()
	if err := <-waited; err != nil {
		t.Fatalf("a request waiting on mine as the partition healed: %v", err)
	}
	if err := vouch(a, "fresh", 5*time.Second); err != nil {
		t.Fatalf("a sandbox newer than the answered roster after the heal: %v", err)
	}
}
