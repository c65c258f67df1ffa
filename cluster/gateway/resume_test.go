package gateway

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
)

// TestResumeOfALostNodesSandbox: a sandbox whose node is gone resumes on a
// live node at its connect (the live node brings it from the shared
// repository), and is bound there; one the repository never got answers a
// clear 404; other calls on a lost sandbox stay 502.
func TestResumeOfALostNodesSandbox(t *testing.T) {
	fx := newFixture(t, "a", "b", "c")
	fx.nodes[1].full, fx.nodes[2].full = true, true
	uploaded, code := fx.create(t)
	never, code2 := fx.create(t)
	if code != http.StatusCreated || code2 != http.StatusCreated || !strings.HasPrefix(uploaded, "a") || !strings.HasPrefix(never, "a") {
		t.Fatalf("creates with b and c full: %d %q, %d %q; want both on a", code, uploaded, code2, never)
	}
	fx.nodes[1].full, fx.nodes[2].full = false, false
	// c is down too, so the resume has one place to go.
	for _, n := range []*fakeNode{fx.nodes[0], fx.nodes[2]} {
		n.srv.Close()
		if _, err := fx.sched.UnregisterNode(context.Background(), &pb.UnregisterNodeRequest{Name: n.name}); err != nil {
			t.Fatal(err)
		}
	}
	fx.nodes[1].repo = map[string]bool{uploaded: true}

	if code, b, _ := fx.do(t, "GET", "/sandboxes/"+uploaded, "", ""); code != http.StatusBadGateway {
		t.Fatalf("GET a sandbox of a lost node: %d %s, want 502", code, b)
	}
	code, b, _ := fx.do(t, "POST", "/v2/sandboxes/"+uploaded+"/connect", "", `{"timeout":60}`) // the SDK's path
	if code != http.StatusCreated || !strings.Contains(string(b), `"node":"b"`) {
		t.Fatalf("connect of a lost node's paused sandbox: %d %s, want 201 from b", code, b)
	}
	look, err := fx.sched.LookupNode(context.Background(), &pb.LookupNodeRequest{SandboxId: uploaded})
	if err != nil || look.GetLost() || look.GetNode().GetStatus().GetName() != "b" {
		t.Fatalf("binding after the resume: %v %v, want b", look, err)
	}
	if code, b, _ := fx.do(t, "GET", "/sandboxes/"+uploaded, "", ""); code != http.StatusOK || !strings.Contains(string(b), `"node":"b"`) {
		t.Fatalf("GET after the resume: %d %s, want b's answer", code, b)
	}
	code, b, _ = fx.do(t, "POST", "/sandboxes/"+never+"/connect", "", `{"timeout":60}`)
	if code != http.StatusNotFound || !strings.Contains(string(b), "repository") || !strings.Contains(string(b), `node a`) {
		t.Fatalf("connect of a never uploaded sandbox of a lost node: %d %s, want a 404 naming the node and the repository", code, b)
	}
}

// TestConcurrentResumesLandOnce: two connects at once of a down node's
// sandbox resume it on one node (placement would spread two resumes over
// two nodes, making two of the sandbox), through one gateway and through
// two replicas of it.
func TestConcurrentResumesLandOnce(t *testing.T) {
	for _, replicas := range []int{1, 2} {
		t.Run(fmt.Sprintf("gateways-%d", replicas), func(t *testing.T) { concurrentResumes(t, replicas) })
	}
}

func concurrentResumes(t *testing.T, replicas int) {
	fx := newFixture(t, "a", "b", "c")
	gws := []string{fx.gw.URL, fx.gw.URL}
	if replicas == 2 {
		second := httptest.NewServer(New(Options{Scheduler: fx.sched, Domain: "sbx.test", LookupTTL: time.Nanosecond}))
		t.Cleanup(second.Close)
		gws[1] = second.URL
	}
	fx.nodes[1].full, fx.nodes[2].full = true, true
	id, code := fx.create(t)
	if code != http.StatusCreated || !strings.HasPrefix(id, "a") {
		t.Fatalf("create with b and c full: %d %q, want it on a", code, id)
	}
	fx.nodes[1].full, fx.nodes[2].full = false, false
	fx.nodes[0].srv.Close()
	if _, err := fx.sched.UnregisterNode(context.Background(), &pb.UnregisterNodeRequest{Name: "a"}); err != nil {
		t.Fatal(err)
	}
	for _, n := range fx.nodes[1:] {
		n.repo = map[string]bool{id: true}
		n.resumeDelay = 300 * time.Millisecond // both connects are in flight at once
	}
	codes := make(chan int, 2)
	for _, gw := range gws {
		go func() {
			resp, err := http.Post(gw+"/sandboxes/"+id+"/connect", "application/json", strings.NewReader(`{"timeout":60}`))
			if err != nil {
				codes <- 0 // t.Fatal belongs to the test's goroutine
				return
			}
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	for range 2 {
		if code := <-codes; code != http.StatusCreated {
			t.Fatalf("concurrent connect: %d, want 201", code)
		}
	}
	holders := 0
	for _, n := range fx.nodes[1:] {
		n.mu.Lock()
		if _, ok := n.boxes[id]; ok {
			holders++
		}
		n.mu.Unlock()
	}
	if holders != 1 {
		t.Fatalf("two connects at once resumed %s on %d nodes, want 1", id, holders)
	}
}

// TestResumeNeedsARestorableNode: a sandbox paused on a KVM node is not
// resumed on a TCG node when its node is down: the connect answers 409
// naming what the live nodes lack, and the TCG node is never asked.
func TestResumeNeedsARestorableNode(t *testing.T) {
	fx := newFixture(t, "a", "b")
	for i, accel := range []string{"kvm", "tcg"} {
		n := fx.nodes[i]
		st := &pb.NodeStatus{Name: n.name, ApiUrl: n.srv.URL, Vmm: "qemu", Accel: accel, CpuModel: "Xeon",
			Capacity: &pb.Resources{CpuCount: 4, MemoryMb: 4096}, Free: &pb.Resources{CpuCount: 4, MemoryMb: 4096}}
		if _, err := fx.sched.RegisterNode(context.Background(), &pb.RegisterNodeRequest{Status: st}); err != nil {
			t.Fatal(err)
		}
	}
	fx.nodes[1].full = true
	id, code := fx.create(t)
	if code != http.StatusCreated || !strings.HasPrefix(id, "a") {
		t.Fatalf("create with b full: %d %q; want it on a", code, id)
	}
	fx.nodes[1].full = false
	fx.nodes[1].repo = map[string]bool{id: true} // b could fetch it: only its platform stops it
	fx.nodes[0].srv.Close()
	if _, err := fx.sched.UnregisterNode(context.Background(), &pb.UnregisterNodeRequest{Name: "a"}); err != nil {
		t.Fatal(err)
	}
	code, b, _ := fx.do(t, "POST", "/v2/sandboxes/"+id+"/connect", "", `{"timeout":60}`)
	if code != http.StatusConflict || !strings.Contains(string(b), `accelerator \"tcg\", not \"kvm\"`) {
		t.Fatalf("connect of a KVM node's sandbox with only a TCG node up: %d %s, want 409 naming the accelerator", code, b)
	}
	look, err := fx.sched.LookupNode(context.Background(), &pb.LookupNodeRequest{SandboxId: id})
	if err != nil || look.GetNode().GetStatus().GetName() != "a" {
		t.Fatalf("binding after the refused resume: %v %v, want still a", look, err)
	}
}
