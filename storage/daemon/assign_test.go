package daemon

import (
	"slices"
	"testing"

	"github.com/agentenv/agentenv/storage/daemon/rpc"
)

// TestAssignSurvivesRestart: a device handed to another owner is that
// owner's after a restart of the daemon too (reclaimed with it, never with
// the owner it had before), and serves the same export.
func TestAssignSurvivesRestart(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 8)
	opts := testOptions(t)
	h := start(t, opts)
	ctx := ctxT(t)
	dev, err := h.c.Create(ctx, rpc.CreateParams{Image: f.config, Owner: "pool-1"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := h.c.Assign(ctx, rpc.AssignParams{ID: dev.ID, Owner: "sandbox-1"})
	if err != nil || got.Owner != "sandbox-1" || got.Socket != dev.Socket || got.Export != dev.Export {
		t.Fatalf("assign: %+v %v", got, err)
	}
	h.stop()
	h2 := start(t, opts)
	devs, err := h2.c.List(ctx)
	if err != nil || len(devs) != 1 || devs[0].Owner != "sandbox-1" || devs[0].State != rpc.StateActive {
		t.Fatalf("devices after restart: %+v %v", devs, err)
	}
	dialDev(t, dev)
	if res, err := h2.c.Reclaim(ctx, "pool-1"); err != nil || len(res.Deleted) != 0 {
		t.Fatalf("reclaim of the old owner: %+v %v", res, err)
	}
	if res, err := h2.c.Reclaim(ctx, "sandbox-1"); err != nil || !slices.Equal(res.Deleted, []uint32{dev.ID}) {
		t.Fatalf("reclaim of the new owner: %+v %v", res, err)
	}
}
