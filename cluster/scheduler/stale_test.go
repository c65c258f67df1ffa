package scheduler

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/agentenv/agentenv/cluster/redistest"
	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
)

// TestStaleCopiesOfARevivedNode: a node back from the dead is told which of
// its roster's sandboxes were resumed on another node meanwhile, and only
// on settled evidence: never while the binding is lost, fresh, or held by
// a node that is down or does not report the sandbox.
func TestStaleCopiesOfARevivedNode(t *testing.T) {
	rs := redistest.Start(t)
	clk := &clock{t: time.Now()}
	a := startReplica(t, rs, "a", clk, nil) // heartbeat 1s, down after 5s, roster grace 2s
	ctx := context.Background()
	heartbeat := func(st *pb.NodeStatus) []string {
		t.Helper()
		r, err := a.client.Heartbeat(ctx, &pb.HeartbeatRequest{Status: st})
		if err != nil || r.GetUnknown() {
			t.Fatalf("heartbeat of %s: %v (err %v)", st.GetName(), r, err)
		}
		return r.GetStale()
	}
	reconcile := func() {
		t.Helper()
		if err := a.s.ReconcileOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	register(t, a.client, status0("n1", 4, 4096, "moved", "kept"))
	register(t, a.client, status0("n2", 4, 4096))
	bind(t, a.client, "moved", "n1")
	bind(t, a.client, "kept", "n1")
	reconcile()
	clk.Add(3 * time.Second)
	heartbeat(status0("n2", 4, 4096))
	clk.Add(3 * time.Second)
	reconcile() // n1 down: both bindings lost
	if got := lookup(t, a.client, "moved"); !got.GetLost() {
		t.Fatalf("moved on down n1: %v, want lost", got)
	}

	// n2 resumes "moved" from the repository; its roster shows it before
	// the gateway binds it there: a lost binding is no one's.
	if got := heartbeat(status0("n2", 4, 4096, "moved")); len(got) != 0 {
		t.Fatalf("stale on n2 resuming a lost sandbox: %v, want none", got)
	}
	bind(t, a.client, "moved", "n2")
	// n1 comes back with both: the binding is fresh, nothing is named yet.
	r, err := a.client.RegisterNode(ctx, &pb.RegisterNodeRequest{Status: status0("n1", 4, 4096, "moved", "kept")})
	if err != nil || len(r.GetStale()) != 0 {
		t.Fatalf("registration of revived n1 right after the resume elsewhere: %v (err %v), want no stale copy yet", r, err)
	}
	reconcile()
	if got := lookup(t, a.client, "moved").GetNode().GetStatus().GetName(); got != "n2" {
		t.Fatalf("moved bound to %q after revived n1's roster, want n2", got)
	}

	// Settled: n1's copy of "moved" is stale, its "kept" is not; n2's copy
	// is the live one.
	clk.Add(3 * time.Second)
	if got := heartbeat(status0("n2", 4, 4096, "moved")); len(got) != 0 {
		t.Fatalf("stale on n2, the holder: %v, want none", got)
	}
	if got := heartbeat(status0("n1", 4, 4096, "moved", "kept")); !slices.Equal(got, []string{"moved"}) {
		t.Fatalf("stale on revived n1: %v, want [moved]", got)
	}
	r, err = a.client.RegisterNode(ctx, &pb.RegisterNodeRequest{Status: status0("n1", 4, 4096, "moved", "kept")})
	if err != nil || !slices.Equal(r.GetStale(), []string{"moved"}) {
		t.Fatalf("registration of revived n1: %v (err %v), want stale [moved]", r, err)
	}

	// No evidence, no removal: the holder not reporting the sandbox, or
	// silent past DownAfter.
	heartbeat(status0("n2", 4, 4096))
	if got := heartbeat(status0("n1", 4, 4096, "moved", "kept")); len(got) != 0 {
		t.Fatalf("stale on n1 while n2 does not report moved: %v, want none", got)
	}
	heartbeat(status0("n2", 4, 4096, "moved"))
	clk.Add(6 * time.Second)
	if got := heartbeat(status0("n1", 4, 4096, "moved", "kept")); len(got) != 0 {
		t.Fatalf("stale on n1 while n2 is silent: %v, want none", got)
	}
}
