package nodeagent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/cluster/redistest"
	"github.com/agentenv/agentenv/cluster/schedtest"
	"github.com/agentenv/agentenv/cluster/scheduler"
	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
	"github.com/redis/go-redis/v9"
)

// fixedSource reports a set usage (the node side of the interface; aenvd's
// implementation reads its orchestrator); DropCopy takes the sandbox out of
// its roster and records it.
type fixedSource struct {
	mu      sync.Mutex
	u       Usage
	dropped []string
}

func (f *fixedSource) Usage() Usage { f.mu.Lock(); defer f.mu.Unlock(); return f.u }

func (f *fixedSource) DropCopy(_ context.Context, id string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := slices.IndexFunc(f.u.Roster, func(s Sandbox) bool { return s.ID == id })
	if i < 0 {
		return "", fmt.Errorf("drop copy of sandbox %s: not here", id)
	}
	state := f.u.Roster[i].State
	f.u.Roster = slices.Delete(f.u.Roster, i, i+1)
	f.dropped = append(f.dropped, id)
	return state, nil
}

func (f *fixedSource) droppedIDs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.dropped)
}

func TestAgentRegistersHeartbeatsUnregisters(t *testing.T) {
	log := slog.New(slog.NewTextHandler(t.Output(), nil))
	served := startScheduler(t, log, nil)
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close() // nothing listens: the agent must move on

	src := &fixedSource{u: Usage{CPUs: 8, FreeCPUs: 8, MemoryMB: 4096, FreeMemoryMB: 3000}}
	a, err := New(Options{Schedulers: []string{deadAddr, served.Addr}, Name: "n1", APIURL: "http://127.0.0.1:1",
		VMM: "qemu", Source: src, Logger: log, RetryInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()

	c := served.Client
	until := func(what string, ok func(*pb.ListNodesResponse) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			nodes, err := c.ListNodes(context.Background(), &pb.ListNodesRequest{})
			if err == nil && ok(nodes) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: nodes %v (err %v)", what, nodes, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	until("registration", func(r *pb.ListNodesResponse) bool {
		return len(r.Nodes) == 1 && r.Nodes[0].Status.GetFree().GetMemoryMb() == 3000
	})
	src.mu.Lock()
	src.u.Roster = []Sandbox{{ID: "sbx1", State: "running", CPUs: 1, MemoryMB: 256}}
	src.u.FreeMemoryMB = 2744
	src.mu.Unlock()
	until("a heartbeat with the roster", func(r *pb.ListNodesResponse) bool {
		return len(r.Nodes) == 1 && len(r.Nodes[0].Status.GetRoster()) == 1 && r.Nodes[0].Status.GetFree().GetMemoryMb() == 2744
	})
	if _, err := c.Drain(context.Background(), &pb.DrainRequest{Name: "n1", Draining: true}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !a.Draining() {
		if time.Now().After(deadline) {
			t.Fatal("the agent never heard of the drain")
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	until("unregistration", func(r *pb.ListNodesResponse) bool { return len(r.Nodes) == 0 })
}

// startScheduler serves a scheduler on a real Redis for the agent under
// test; mutate adjusts its options (heartbeat interval, clock).
func startScheduler(t *testing.T, log *slog.Logger, mutate func(*scheduler.Options)) *schedtest.Server {
	t.Helper()
	rs := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr})
	t.Cleanup(func() { _ = rdb.Close() })
	opts := scheduler.Options{Redis: rdb, HeartbeatInterval: 100 * time.Millisecond, Logger: log}
	if mutate != nil {
		mutate(&opts)
	}
	s, err := scheduler.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return schedtest.Serve(t, s)
}
