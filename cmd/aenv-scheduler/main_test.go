package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/cluster/redistest"
	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// syncBuffer collects a process's output while it runs.
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

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestReplicasSurviveKill runs two aenv-scheduler processes on one Redis:
// kill -9 of the one holding the lease leaves the other answering and
// taking the lease; SIGTERM stops a replica cleanly.
func TestReplicasSurviveKill(t *testing.T) {
	rs := redistest.Start(t)
	bin := filepath.Join(t.TempDir(), "aenv-scheduler")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	start := func(id string, extra ...string) (*exec.Cmd, string, *syncBuffer) {
		addr := freeAddr(t)
		cmd := exec.Command(bin, append([]string{"--listen", addr, "--replica-id", id, "--lease-ttl", "1s"}, extra...)...)
		out := &syncBuffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd, addr, out
	}
	client := func(addr string) pb.SchedulerClient {
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cc.Close() })
		return pb.NewSchedulerClient(cc)
	}
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	a, aAddr, aOut := start("a", "--redis", "redis://"+rs.Addr+"/0")
	waitFor("replica a to lead", func() bool { return strings.Contains(aOut.String(), "holding the reconciliation lease") })
	// b: Redis as host:port, and one node expected by static discovery.
	b, bAddr, bOut := start("b", "--redis", rs.Addr, "--discovery", "static", "--nodes", "10.0.0.9:3000")
	ca, cb := client(aAddr), client(bAddr)
	ctx := context.Background()
	waitFor("replica a to answer", func() bool {
		_, err := ca.RegisterNode(ctx, &pb.RegisterNodeRequest{Status: &pb.NodeStatus{Name: "n1", ApiUrl: "http://127.0.0.1:1"}})
		return err == nil
	})
	if _, err := ca.Bind(ctx, &pb.BindRequest{SandboxId: "sbx1", Node: "n1"}); err != nil {
		t.Fatal(err)
	}
	if err := a.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = a.Wait()
	var got string
	waitFor("replica b to answer", func() bool {
		r, err := cb.LookupNode(ctx, &pb.LookupNodeRequest{SandboxId: "sbx1"})
		got = r.GetNode().GetStatus().GetName()
		return err == nil
	})
	if got != "n1" {
		t.Fatalf("b's lookup after a's kill: %q, want n1", got)
	}
	nodes, err := cb.ListNodes(ctx, &pb.ListNodesRequest{})
	if err != nil || len(nodes.Nodes) != 2 || nodes.Nodes[1].Status.Name != "10.0.0.9:3000" || nodes.Nodes[1].State != pb.NodeState_NODE_STATE_DOWN {
		t.Fatalf("b's nodes with a discovered node that never registered: %v (err %v)", nodes, err)
	}
	waitFor("replica b to take the lease", func() bool { return strings.Contains(bOut.String(), "holding the reconciliation lease") })
	if err := b.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := b.Wait(); err != nil {
		t.Fatalf("graceful stop: %v\n%s", err, bOut.String())
	}
	if !strings.Contains(bOut.String(), "aenv-scheduler stopped") {
		t.Fatalf("no clean stop in the log:\n%s", bOut.String())
	}
	_ = os.Remove(bin)
}
