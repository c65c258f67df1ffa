package lifecycle

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/store"
)

// TestForkFailureLetsGoAndLeavesNothing: a fork whose capture fails (the
// record names no device to seal) releases the parent, starts no child and
// leaves no snapshot record or directory; the parent runs on.
func TestForkFailureLetsGoAndLeavesNothing(t *testing.T) {
	v, j, rec := setup(t)
	s := &serving{rec: rec, m: &machine{}, j: j}
	unlocked, children := 0, 0
	_, out, err := v.Fork(context.Background(), s, ForkPlan{Count: 3, Parallel: 2,
		Memory: func(context.Context, Sandbox, string, string) error { return nil },
		Unlock: func() { unlocked++ },
		Child: func(context.Context, snapshot.Record, sandbox.Record) (sandbox.Record, error) {
			children++
			return sandbox.Record{}, nil
		}})
	if err == nil || out != nil {
		t.Fatalf("Fork = %v, %d results; want the capture's failure and no results", err, len(out))
	}
	if unlocked != 1 || children != 0 {
		t.Fatalf("parent unlocked %d times, %d children started; want 1 and 0", unlocked, children)
	}
	snaps, err := store.ListAll[snapshot.Record](v.Store, store.Snapshots)
	if err != nil || len(snaps) != 0 {
		t.Fatalf("snapshot records after a failed fork: %v (%v); want none", snaps, err)
	}
	if ents, err := os.ReadDir(filepath.Join(v.DataDir, "snapshots")); err == nil && len(ents) != 0 {
		t.Fatalf("a failed fork left %d snapshot directories", len(ents))
	}
	if got := stored(t, v.Store, rec.ID); got.State != sandbox.Running {
		t.Fatalf("parent is %s after a failed fork; want running", got.State)
	}
}

// TestForkChildrenBoundedAndOwnErrors: children start at most Parallel at
// once, each from the fork's snapshot with the parent's record, and one
// child's failure is its own result.
func TestForkChildrenBoundedAndOwnErrors(t *testing.T) {
	v := &Verbs{}
	var running, peak, calls atomic.Int32
	var failOnce atomic.Bool
	gate := make(chan struct{})
	snap := snapshot.Record{ID: "snap1"}
	parent := sandbox.Record{ID: "parent"}
	boom := errors.New("boom")
	plan := ForkPlan{Count: 5, Parallel: 2, Child: func(_ context.Context, sn snapshot.Record, p sandbox.Record) (sandbox.Record, error) {
		n := running.Add(1)
		defer running.Add(-1)
		for {
			old := peak.Load()
			if n <= old || peak.CompareAndSwap(old, n) {
				break
			}
		}
		if calls.Add(1) == 2 {
			close(gate)
		}
		<-gate
		if sn.ID != snap.ID || p.ID != parent.ID {
			return sandbox.Record{}, errors.New("child given the wrong snapshot or parent")
		}
		if failOnce.CompareAndSwap(false, true) {
			return sandbox.Record{}, boom
		}
		return sandbox.Record{ID: "child"}, nil
	}}
	out := v.forkChildren(context.Background(), snap, parent, plan)
	if len(out) != 5 || peak.Load() > 2 {
		t.Fatalf("%d results, %d children at once; want 5 results, at most 2 at once", len(out), peak.Load())
	}
	failed := 0
	for _, r := range out {
		switch {
		case errors.Is(r.Err, boom):
			failed++
		case r.Err != nil || r.Sandbox.ID != "child":
			t.Fatalf("child result %+v; want a child or boom", r)
		}
	}
	if failed != 1 {
		t.Fatalf("%d children failed; want exactly the one that returned boom", failed)
	}
}
