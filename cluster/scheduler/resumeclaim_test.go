package scheduler

import (
	"context"
	"testing"
	"time"

	"github.com/agentenv/agentenv/cluster/redistest"
	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestResumeClaim: one holder at a time, on any replica; only the holder
// releases it; an unreleased claim expires; bad requests are refused.
func TestResumeClaim(t *testing.T) {
	rs := redistest.Start(t)
	a := startReplica(t, rs, "a", nil, nil)
	b := startReplica(t, rs, "b", nil, nil)
	ctx := context.Background()
	claim := func(c pb.SchedulerClient, holder string, ttl time.Duration) bool {
		t.Helper()
		r, err := c.ClaimResume(ctx, &pb.ClaimResumeRequest{SandboxId: "sbx1", Holder: holder, TtlMs: ttl.Milliseconds()})
		if err != nil {
			t.Fatalf("claim by %s: %v", holder, err)
		}
		return r.GetGranted()
	}
	release := func(c pb.SchedulerClient, holder string) {
		t.Helper()
		if _, err := c.ReleaseResume(ctx, &pb.ReleaseResumeRequest{SandboxId: "sbx1", Holder: holder}); err != nil {
			t.Fatalf("release by %s: %v", holder, err)
		}
	}
	if !claim(a.client, "g1", time.Minute) {
		t.Fatal("the first claim was refused")
	}
	if claim(b.client, "g2", time.Minute) {
		t.Fatal("a second holder got the claim through another replica")
	}
	release(b.client, "g2") // not the holder: changes nothing
	if claim(a.client, "g2", time.Minute) {
		t.Fatal("a release by someone else ended the claim")
	}
	release(a.client, "g1")
	if !claim(b.client, "g2", 200*time.Millisecond) {
		t.Fatal("the claim was not free after its holder's release")
	}
	time.Sleep(300 * time.Millisecond) // g2 never releases: its TTL ends it
	if !claim(a.client, "g3", time.Minute) {
		t.Fatal("an expired claim still held")
	}
	for _, req := range []*pb.ClaimResumeRequest{
		{SandboxId: "sbx1", Holder: "", TtlMs: 1000},
		{SandboxId: "", Holder: "g", TtlMs: 1000},
		{SandboxId: "sbx1", Holder: "g", TtlMs: 0},
		{SandboxId: "sbx1", Holder: "g", TtlMs: int64(time.Hour / time.Millisecond)},
	} {
		if _, err := a.client.ClaimResume(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("claim %v: %v, want InvalidArgument", req, err)
		}
	}
}
