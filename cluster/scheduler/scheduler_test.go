package scheduler

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/cluster/redistest"
	"github.com/agentenv/agentenv/cluster/schedtest"
	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// clock is a settable test clock shared by replicas.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// replica is a scheduler served over real gRPC on loopback.
type replica struct {
	s      *Scheduler
	srv    *grpc.Server
	client pb.SchedulerClient
}

func startReplica(t *testing.T, rs *redistest.Server, id string, clk *clock, mod func(*Options)) *replica {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	opts := Options{Redis: rdb, ReplicaID: id, Prefix: "t:", HeartbeatInterval: time.Second, DownAfter: 5 * time.Second,
		Logger:   slog.New(slog.NewTextHandler(t.Output(), nil)),
		LeaseTTL: 2 * time.Second}
	if clk != nil {
		opts.Now = clk.Now
	}
	if mod != nil {
		mod(&opts)
	}
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	served := schedtest.Serve(t, s)
	return &replica{s: s, srv: served.GRPC, client: served.Client}
}

func status0(name string, cpus int32, freeMem int64, roster ...string) *pb.NodeStatus {
	st := &pb.NodeStatus{Name: name, ApiUrl: "http://" + name + ".invalid:3000", P2PEndpoint: name + ":7000", Vmm: "qemu",
		Capacity: &pb.Resources{CpuCount: cpus, MemoryMb: 8192}, Free: &pb.Resources{CpuCount: cpus, MemoryMb: freeMem}}
	for _, id := range roster {
		st.Roster = append(st.Roster, &pb.RosterEntry{SandboxId: id, State: "running", Resources: &pb.Resources{CpuCount: 1, MemoryMb: 256}})
	}
	return st
}

func register(t *testing.T, c pb.SchedulerClient, st *pb.NodeStatus) {
	t.Helper()
	if _, err := c.RegisterNode(context.Background(), &pb.RegisterNodeRequest{Status: st}); err != nil {
		t.Fatalf("register %s: %v", st.Name, err)
	}
}

func bind(t *testing.T, c pb.SchedulerClient, id, node string) {
	t.Helper()
	if _, err := c.Bind(context.Background(), &pb.BindRequest{SandboxId: id, Node: node, Resources: &pb.Resources{CpuCount: 1, MemoryMb: 256}}); err != nil {
		t.Fatalf("bind %s to %s: %v", id, node, err)
	}
}

func lookup(t *testing.T, c pb.SchedulerClient, id string) *pb.LookupNodeResponse {
	t.Helper()
	r, err := c.LookupNode(context.Background(), &pb.LookupNodeRequest{SandboxId: id})
	if err != nil {
		t.Fatalf("lookup %s: %v", id, err)
	}
	return r
}

func place(t *testing.T, c pb.SchedulerClient, mem int64, exclude ...string) (string, error) {
	t.Helper()
	r, err := c.Place(context.Background(), &pb.PlaceRequest{Resources: &pb.Resources{CpuCount: 1, MemoryMb: mem}, Exclude: exclude})
	return r.GetNode().GetStatus().GetName(), err
}

func TestTwoReplicasOneKilled(t *testing.T) {
	rs := redistest.Start(t)
	a := startReplica(t, rs, "a", nil, func(o *Options) { o.LeaseTTL = 500 * time.Millisecond })
	b := startReplica(t, rs, "b", nil, func(o *Options) { o.LeaseTTL = 500 * time.Millisecond })
	register(t, a.client, status0("n1", 4, 4096))
	bind(t, a.client, "sbx1", "n1")
	for _, r := range []*replica{a, b} {
		if got := lookup(t, r.client, "sbx1").GetNode().GetStatus().GetName(); got != "n1" {
			t.Fatalf("lookup through a replica: node %q, want n1", got)
		}
	}
	ctx := context.Background()
	if err := a.s.ReconcileOnce(ctx); err != nil || !a.s.IsLeader() {
		t.Fatalf("replica a did not take the free lease: %v", err)
	}
	if err := b.s.ReconcileOnce(ctx); err != nil || b.s.IsLeader() {
		t.Fatalf("replica b took a lease a holds (err %v)", err)
	}
	// a dies without resigning: b answers at once and takes the lease once
	// it expires.
	a.srv.Stop()
	if got := lookup(t, b.client, "sbx1").GetNode().GetStatus().GetName(); got != "n1" {
		t.Fatalf("after a's death: node %q, want n1", got)
	}
	if _, err := a.client.LookupNode(ctx, &pb.LookupNodeRequest{SandboxId: "sbx1"}); err == nil {
		t.Fatal("a dead replica answered")
	}
	deadline := time.Now().Add(10 * time.Second)
	for !b.s.IsLeader() {
		if time.Now().After(deadline) {
			t.Fatal("b never took the expired lease")
		}
		time.Sleep(50 * time.Millisecond)
		if err := b.s.ReconcileOnce(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// a's old token is fenced: its writes are refused.
	a.s.lease.mu.Lock()
	stale := a.s.lease.token
	a.s.lease.mu.Unlock()
	r, err := a.s.loadNode(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.s.markDown(ctx, stale, "n1", r); err != errFenced {
		t.Fatalf("a write under a stale lease: %v, want errFenced", err)
	}
	if got := lookup(t, b.client, "sbx1"); got.Lost || got.Node.State != pb.NodeState_NODE_STATE_UP {
		t.Fatalf("the fenced write changed the node: %v", got)
	}
}

func TestRedisRestartKeepsState(t *testing.T) {
	rs := redistest.Start(t)
	a := startReplica(t, rs, "a", nil, nil)
	register(t, a.client, status0("n1", 4, 4096))
	register(t, a.client, status0("n2", 4, 4096))
	bind(t, a.client, "sbx1", "n1")
	bind(t, a.client, "sbx2", "n2")
	if _, err := a.client.Drain(context.Background(), &pb.DrainRequest{Name: "n2", Draining: true}); err != nil {
		t.Fatal(err)
	}
	rs.Restart()
	// A new replica (a scheduler restart) and the old one (its client
	// reconnects) both see everything.
	b := startReplica(t, rs, "b", nil, nil)
	for _, r := range []*replica{a, b} {
		if got := lookup(t, r.client, "sbx1").GetNode().GetStatus().GetName(); got != "n1" {
			t.Fatalf("sbx1 after the restart: node %q, want n1", got)
		}
		if got := lookup(t, r.client, "sbx2").GetNode().GetStatus().GetName(); got != "n2" {
			t.Fatalf("sbx2 after the restart: node %q, want n2", got)
		}
		nodes, err := r.client.ListNodes(context.Background(), &pb.ListNodesRequest{})
		if err != nil || len(nodes.Nodes) != 2 || !nodes.Nodes[1].Draining {
			t.Fatalf("nodes after the restart: %v (err %v), want n1 and n2 draining", nodes, err)
		}
	}
}

func TestSilentNodeGoesDown(t *testing.T) {
	rs := redistest.Start(t)
	clk := &clock{t: time.Now()}
	a := startReplica(t, rs, "a", clk, nil)
	register(t, a.client, status0("n1", 4, 4096, "sbx1"))
	register(t, a.client, status0("n2", 4, 4096))
	bind(t, a.client, "sbx1", "n1")
	ctx := context.Background()
	if err := a.s.ReconcileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	clk.Add(3 * time.Second)
	if _, err := a.client.Heartbeat(ctx, &pb.HeartbeatRequest{Status: status0("n2", 4, 4096)}); err != nil {
		t.Fatal(err)
	}
	clk.Add(3 * time.Second) // n1 silent 6s > DownAfter 5s; n2 3s
	if err := a.s.ReconcileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	got := lookup(t, a.client, "sbx1")
	if !got.Lost || got.Node.State != pb.NodeState_NODE_STATE_DOWN {
		t.Fatalf("sbx1 on a silent node: %v, want lost on a down node", got)
	}
	lost, err := a.client.ListLost(ctx, &pb.ListLostRequest{})
	if err != nil || len(lost.Lost) != 1 || lost.Lost[0].SandboxId != "sbx1" || lost.Lost[0].Node != "n1" {
		t.Fatalf("lost bindings: %v (err %v), want sbx1 on n1", lost, err)
	}
	if n, err := place(t, a.client, 256); err != nil || n != "n2" {
		t.Fatalf("placement with n1 down: %q (err %v), want n2", n, err)
	}
	peers, err := a.client.ListPeers(ctx, &pb.ListPeersRequest{Node: "n2"})
	if err != nil || len(peers.Peers) != 0 {
		t.Fatalf("peers of n2 with n1 down: %v (err %v), want none", peers, err)
	}
	// n1 comes back still holding sbx1: the roster makes it found again.
	if _, err := a.client.Heartbeat(ctx, &pb.HeartbeatRequest{Status: status0("n1", 4, 4096, "sbx1")}); err != nil {
		t.Fatal(err)
	}
	// Routed to its node at once, before the leader's next pass.
	if got := lookup(t, a.client, "sbx1"); got.Lost || got.Node.State != pb.NodeState_NODE_STATE_UP {
		t.Fatalf("sbx1 as its node came back: %v", got)
	}
	if err := a.s.ReconcileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if lost, err := a.client.ListLost(ctx, &pb.ListLostRequest{}); err != nil || len(lost.Lost) != 0 {
		t.Fatalf("lost bindings after the roster of the returned node: %v (err %v)", lost, err)
	}
}

func TestRosterReconciles(t *testing.T) {
	rs := redistest.Start(t)
	clk := &clock{t: time.Now()}
	a := startReplica(t, rs, "a", clk, nil)
	ctx := context.Background()
	register(t, a.client, status0("n1", 4, 4096))
	register(t, a.client, status0("n2", 4, 4096))
	bind(t, a.client, "old", "n1")   // n1 will stop reporting it
	bind(t, a.client, "moved", "n1") // n2 will report it
	clk.Add(3 * time.Second)         // past RosterGrace (2s)
	bind(t, a.client, "fresh", "n1") // bound after n1's roster
	for _, st := range []*pb.NodeStatus{status0("n1", 4, 4096, "unknown"), status0("n2", 4, 4096, "moved")} {
		if _, err := a.client.Heartbeat(ctx, &pb.HeartbeatRequest{Status: st}); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.s.ReconcileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := a.client.LookupNode(ctx, &pb.LookupNodeRequest{SandboxId: "old"}); status.Code(err) != codes.NotFound {
		t.Fatalf("a binding its node no longer reports: %v, want NotFound", err)
	}
	for id, want := range map[string]string{"moved": "n2", "unknown": "n1", "fresh": "n1"} {
		if got := lookup(t, a.client, id).GetNode().GetStatus().GetName(); got != want {
			t.Errorf("%s bound to %q, want %q", id, got, want)
		}
	}
}

func TestDrainAndPlacement(t *testing.T) {
	rs := redistest.Start(t)
	a := startReplica(t, rs, "a", nil, nil)
	ctx := context.Background()
	register(t, a.client, status0("n1", 4, 4096))
	register(t, a.client, status0("n2", 4, 4096))
	register(t, a.client, status0("small", 4, 128))
	// Least-loaded spreads: n1 and n2 alternate as bindings land; "small"
	// cannot hold 256 MB.
	counts := map[string]int{}
	for i := range 6 {
		p, err := a.client.Place(ctx, &pb.PlaceRequest{Resources: &pb.Resources{CpuCount: 1, MemoryMb: 256}})
		if err != nil {
			t.Fatal(err)
		}
		n := p.GetNode().GetStatus().GetName()
		counts[n]++
		_, err = a.client.Bind(ctx, &pb.BindRequest{SandboxId: "s" + string(rune('a'+i)), Node: n,
			Resources: &pb.Resources{CpuCount: 1, MemoryMb: 256}, Reservation: p.GetReservation()})
		if err != nil {
			t.Fatal(err)
		}
	}
	if counts["n1"] != 3 || counts["n2"] != 3 {
		t.Fatalf("least-loaded placement: %v, want 3 on n1 and n2, none on small", counts)
	}
	if _, err := a.client.Drain(ctx, &pb.DrainRequest{Name: "n1", Draining: true}); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if n, err := place(t, a.client, 256); err != nil || n != "n2" {
			t.Fatalf("placement with n1 draining: %q (err %v), want n2", n, err)
		}
	}
	if _, err := place(t, a.client, 256, "n2"); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("placement with every fitting node drained or excluded: %v, want ResourceExhausted", err)
	}
	hb, err := a.client.Heartbeat(ctx, &pb.HeartbeatRequest{Status: status0("n1", 4, 4096)})
	if err != nil || !hb.Draining {
		t.Fatalf("heartbeat of a drained node: %v (err %v), want draining", hb, err)
	}
	if _, err := a.client.Drain(ctx, &pb.DrainRequest{Name: "nope", Draining: true}); status.Code(err) != codes.NotFound {
		t.Fatalf("drain of an unknown node: %v, want NotFound", err)
	}
}

func TestRoundRobin(t *testing.T) {
	rs := redistest.Start(t)
	a := startReplica(t, rs, "a", nil, func(o *Options) { o.Policy = RoundRobin })
	b := startReplica(t, rs, "b", nil, func(o *Options) { o.Policy = RoundRobin })
	for _, n := range []string{"n1", "n2", "n3"} {
		register(t, a.client, status0(n, 4, 4096))
	}
	seen := map[string]int{}
	for i := range 6 {
		c := []pb.SchedulerClient{a.client, b.client}[i%2] // the counter is shared
		n, err := place(t, c, 256)
		if err != nil {
			t.Fatal(err)
		}
		seen[n]++
	}
	if seen["n1"] != 2 || seen["n2"] != 2 || seen["n3"] != 2 {
		t.Fatalf("round-robin over two replicas: %v, want 2 each", seen)
	}
}

func TestUnregisterAndInvalidInput(t *testing.T) {
	rs := redistest.Start(t)
	a := startReplica(t, rs, "a", nil, nil)
	ctx := context.Background()
	register(t, a.client, status0("n1", 4, 4096))
	bind(t, a.client, "sbx1", "n1")
	if _, err := a.client.UnregisterNode(ctx, &pb.UnregisterNodeRequest{Name: "n1"}); err != nil {
		t.Fatal(err)
	}
	if got := lookup(t, a.client, "sbx1"); !got.Lost {
		t.Fatalf("binding of an unregistered node: %v, want lost", got)
	}
	hb, err := a.client.Heartbeat(ctx, &pb.HeartbeatRequest{Status: status0("n1", 4, 4096)})
	if err != nil || !hb.Unknown {
		t.Fatalf("heartbeat after unregister: %v (err %v), want unknown", hb, err)
	}
	if _, err := a.client.Bind(ctx, &pb.BindRequest{SandboxId: "x", Node: "n1"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("bind to an unregistered node: %v", err)
	}
	bad := []*pb.NodeStatus{nil, {Name: ""}, {Name: "a b", ApiUrl: "http://x"}, {Name: "n", ApiUrl: ""},
		{Name: "n", ApiUrl: "http://x", Roster: []*pb.RosterEntry{{SandboxId: ""}}}}
	for _, st := range bad {
		if _, err := a.client.RegisterNode(ctx, &pb.RegisterNodeRequest{Status: st}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("register %v: %v, want InvalidArgument", st, err)
		}
	}
	if _, err := a.client.Place(ctx, &pb.PlaceRequest{Resources: &pb.Resources{MemoryMb: -1}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("negative placement: %v", err)
	}
}

func TestBurstSpreads(t *testing.T) {
	rs := redistest.Start(t)
	a := startReplica(t, rs, "a", nil, nil)
	for _, n := range []string{"n1", "n2", "n3"} {
		register(t, a.client, status0(n, 4, 4096))
	}
	// Six placements before any bind (a burst of creates in flight): the
	// reservations spread them; a heartbeat whose roster holds them keeps
	// counting them (and a third one made on the node directly).
	counts := map[string]int{}
	for range 6 {
		n, err := place(t, a.client, 256)
		if err != nil {
			t.Fatal(err)
		}
		counts[n]++
	}
	if counts["n1"] != 2 || counts["n2"] != 2 || counts["n3"] != 2 {
		t.Fatalf("a burst of placements: %v, want 2 on each node", counts)
	}
	if _, err := a.client.Heartbeat(context.Background(), &pb.HeartbeatRequest{Status: status0("n1", 4, 4096, "x1", "x2", "x3")}); err != nil {
		t.Fatal(err)
	}
	if n, err := place(t, a.client, 256); err != nil || n == "n1" {
		t.Fatalf("after n1 reported three: placed on %q (err %v), want n2 or n3", n, err)
	}
}

// TestMarkDownInterrupted: a leader that fails before marking a silent node
// down leaves the next pass to do it; lookups see the node down meanwhile.
func TestMarkDownInterrupted(t *testing.T) {
	rs := redistest.Start(t)
	clk := &clock{t: time.Now()}
	a := startReplica(t, rs, "a", clk, nil)
	register(t, a.client, status0("n1", 4, 4096, "sbx1"))
	bind(t, a.client, "sbx1", "n1")
	clk.Add(6 * time.Second)
	if err := failpoint.Arm("scheduler/reconcile/markdown", "error"); err != nil {
		t.Fatal(err)
	}
	err := a.s.ReconcileOnce(context.Background())
	if disarm := failpoint.Arm("scheduler/reconcile/markdown", ""); disarm != nil {
		t.Fatal(disarm)
	}
	if !errors.Is(err, failpoint.ErrInjected) {
		t.Fatalf("interrupted pass: %v, want the injected error", err)
	}
	if got := lookup(t, a.client, "sbx1"); !got.Lost {
		t.Fatalf("lookup on a silent node not yet marked: %v, want lost", got)
	}
	if lost, _ := a.client.ListLost(context.Background(), &pb.ListLostRequest{}); len(lost.GetLost()) != 0 {
		t.Fatalf("lost bindings before the mark: %v", lost)
	}
	if err := a.s.ReconcileOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	if lost, err := a.client.ListLost(context.Background(), &pb.ListLostRequest{}); err != nil || len(lost.GetLost()) != 1 {
		t.Fatalf("lost bindings after the next pass: %v (err %v)", lost, err)
	}
}

func TestDiscoveredButUnregistered(t *testing.T) {
	rs := redistest.Start(t)
	a := startReplica(t, rs, "a", nil, nil)
	register(t, a.client, status0("n1", 4, 4096)) // api http://n1.invalid:3000
	a.s.SetDiscovered([]string{"n1.invalid:3000", "10.0.0.7:3000"})
	nodes, err := a.client.ListNodes(context.Background(), &pb.ListNodesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Nodes) != 2 || nodes.Nodes[0].Status.Name != "n1" || nodes.Nodes[1].Status.Name != "10.0.0.7:3000" ||
		nodes.Nodes[1].State != pb.NodeState_NODE_STATE_DOWN {
		t.Fatalf("nodes with one discovered but unregistered: %v", nodes)
	}
	if n, err := place(t, a.client, 256); err != nil || n != "n1" {
		t.Fatalf("placement: %q (err %v), want n1 (an unregistered node gets nothing)", n, err)
	}
}

// TestReservationsExpire: a placement never bound (its create failed) stops
// counting against its node after ReserveTTL; heartbeats do not clear it.
func TestReservationsExpire(t *testing.T) {
	rs := redistest.Start(t)
	clk := &clock{t: time.Now()}
	a := startReplica(t, rs, "a", clk, func(o *Options) { o.ReserveTTL = 10 * time.Second; o.DownAfter = time.Hour })
	register(t, a.client, status0("n1", 4, 4096))
	register(t, a.client, status0("n2", 4, 4096))
	for _, want := range []string{"n1", "n2"} {
		if n, err := place(t, a.client, 256); err != nil || n != want {
			t.Fatalf("placement: %q (err %v), want %q", n, err, want)
		}
	}
	if _, err := a.client.Heartbeat(context.Background(), &pb.HeartbeatRequest{Status: status0("n1", 4, 4096)}); err != nil {
		t.Fatal(err)
	}
	clk.Add(5 * time.Second)
	if n, err := place(t, a.client, 256); err != nil || n != "n1" { // 1 each still: name order
		t.Fatalf("placement with live reservations: %q (err %v), want n1", n, err)
	}
	if n, err := place(t, a.client, 256); err != nil || n != "n2" { // n1 holds 2 now
		t.Fatalf("placement with n1 holding two reservations: %q (err %v), want n2", n, err)
	}
	clk.Add(6 * time.Second) // the first two expired, the last two live
	if n, err := place(t, a.client, 256); err != nil || n != "n1" {
		t.Fatalf("placement after expiry: %q (err %v), want n1", n, err)
	}
}

// TestConcurrentBurstSpreads: placements made at once through two replicas
// (the SDK's Promise.all of creates) spread evenly.
func TestConcurrentBurstSpreads(t *testing.T) {
	rs := redistest.Start(t)
	a := startReplica(t, rs, "a", nil, nil)
	b := startReplica(t, rs, "b", nil, nil)
	for _, n := range []string{"n1", "n2", "n3"} {
		register(t, a.client, status0(n, 4, 4096))
	}
	var mu sync.Mutex
	counts := map[string]int{}
	var wg sync.WaitGroup
	for i := range 9 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := []pb.SchedulerClient{a.client, b.client}[i%2]
			r, err := c.Place(context.Background(), &pb.PlaceRequest{Resources: &pb.Resources{CpuCount: 1, MemoryMb: 256}})
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			counts[r.Node.Status.Name]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if counts["n1"] != 3 || counts["n2"] != 3 || counts["n3"] != 3 {
		t.Fatalf("9 placements at once: %v, want 3 on each node", counts)
	}
}

// TestRosterOfARevivedNode: a node back from the dead whose roster still
// reports a sandbox resumed meanwhile on another live node (which reports
// it too) leaves the binding where it is.
func TestRosterOfARevivedNode(t *testing.T) {
	rs := redistest.Start(t)
	clk := &clock{t: time.Now()}
	a := startReplica(t, rs, "a", clk, nil)
	ctx := context.Background()
	register(t, a.client, status0("n1", 4, 4096))
	register(t, a.client, status0("n2", 4, 4096))
	bind(t, a.client, "resumed", "n2")
	clk.Add(3 * time.Second)
	for _, st := range []*pb.NodeStatus{status0("n1", 4, 4096, "resumed"), status0("n2", 4, 4096, "resumed")} {
		if _, err := a.client.Heartbeat(ctx, &pb.HeartbeatRequest{Status: st}); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 { // both orders of the nodes' passes
		if err := a.s.ReconcileOnce(ctx); err != nil {
			t.Fatal(err)
		}
		if got := lookup(t, a.client, "resumed").GetNode().GetStatus().GetName(); got != "n2" {
			t.Fatalf("a sandbox n2 holds and reports, also in the roster of revived n1: bound to %q, want n2", got)
		}
	}
}

// TestBindReleasesItsReservation: a bind gives back the reservation of the
// placement it names (not the node's oldest), a bind naming none gives back
// none, and Unreserve gives one back without a sandbox.
func TestBindReleasesItsReservation(t *testing.T) {
	rs := redistest.Start(t)
	a := startReplica(t, rs, "a", nil, nil)
	ctx := context.Background()
	register(t, a.client, status0("n1", 8, 400))
	placeMB := func(mb int64) *pb.PlaceResponse {
		t.Helper()
		p, err := a.client.Place(ctx, &pb.PlaceRequest{Resources: &pb.Resources{CpuCount: 1, MemoryMb: mb}})
		if err != nil {
			t.Fatalf("place %d MB: %v", mb, err)
		}
		return p
	}
	fits := func(mb int64) bool {
		p, err := a.client.Place(ctx, &pb.PlaceRequest{Resources: &pb.Resources{CpuCount: 1, MemoryMb: mb}})
		if err == nil {
			_, _ = a.client.Unreserve(ctx, &pb.UnreserveRequest{Node: "n1", Reservation: p.GetReservation()})
		}
		return err == nil
	}
	small, big := placeMB(100), placeMB(200) // 100 MB of 400 left
	if small.GetReservation() == "" || small.GetReservation() == big.GetReservation() {
		t.Fatalf("reservations %q and %q, want two distinct", small.GetReservation(), big.GetReservation())
	}
	// A fork child's bind names no reservation: both stay.
	if _, err := a.client.Bind(ctx, &pb.BindRequest{SandboxId: "child", Node: "n1"}); err != nil {
		t.Fatal(err)
	}
	if fits(150) {
		t.Fatal("a bind naming no reservation gave one back")
	}
	// The big create's bind gives back its 200 MB: 300 MB are free, so 250
	// fit (had the oldest, 100 MB, gone instead, 200 would be free).
	if _, err := a.client.Bind(ctx, &pb.BindRequest{SandboxId: "big", Node: "n1", Reservation: big.GetReservation()}); err != nil {
		t.Fatal(err)
	}
	if !fits(250) || fits(350) {
		t.Fatal("after the big create's bind, want 300 MB free (its own reservation given back)")
	}
	if _, err := a.client.Unreserve(ctx, &pb.UnreserveRequest{Node: "n1", Reservation: small.GetReservation()}); err != nil {
		t.Fatal(err)
	}
	if !fits(400) {
		t.Fatal("after Unreserve of the small create, want all 400 MB free")
	}
	if _, err := a.client.Unreserve(ctx, &pb.UnreserveRequest{Node: "n1"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("unreserve without a reservation: %v, want InvalidArgument", err)
	}
}
