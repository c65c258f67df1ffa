package lifecycle

import (
	"context"
	"fmt"
	"os"
	"sync"

	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/store"
)

var fpForkSnapshot = failpoint.New("orchestrator/fork/snapshot") // the hidden snapshot exists, no child yet

// ForkResult is one child of a fork: its record, or why it failed.
type ForkResult struct {
	Sandbox sandbox.Record
	Err     error
}

// ForkPlan is what a fork needs besides the sandbox: how many children,
// how many restore at once, and the node's ways to capture memory, to
// let go of the parent and to start a child.
type ForkPlan struct {
	Count    int
	Parallel int
	Memory   MemoryCapture
	// Unlock releases the caller's hold on the parent once the snapshot
	// is durable: the children need the snapshot, not the parent.
	Unlock func()
	// Child starts one child from the snapshot with the parent's settings.
	Child func(ctx context.Context, snap snapshot.Record, parent sandbox.Record) (sandbox.Record, error)
}

// Fork starts plan.Count children from one capture of s, in stages:
//
//	capture   Snapshot, hidden (a running parent pauses for it and runs on)
//	record    the snapshot's record is durable (undo: record and directory go)
//	release   the parent is let go (plan.Unlock), whatever happened above
//	children  plan.Count creates from the snapshot, plan.Parallel at once;
//	          a child's failure is its own result, not the fork's
//
// The hidden snapshot is collected by the node once its last child is gone.
func (v *Verbs) Fork(ctx context.Context, s Sandbox, plan ForkPlan) (snapshot.Record, []ForkResult, error) {
	parent := s.Record()
	snap, err := v.forkSnapshot(ctx, s, plan.Memory)
	plan.Unlock()
	if err != nil {
		return snap, nil, fmt.Errorf("fork sandbox %s: %w", parent.ID, err)
	}
	return snap, v.forkChildren(ctx, snap, parent, plan), nil
}

// forkSnapshot runs the capture and record stages, undoing both on error.
func (v *Verbs) forkSnapshot(ctx context.Context, s Sandbox, memory MemoryCapture) (snapshot.Record, error) {
	var undo undoStack
	snap, err := v.Snapshot(ctx, s, true, memory)
	if err != nil {
		return snap, err
	}
	undo.add(func(context.Context) error { return os.RemoveAll(snap.Dir) })
	if err = v.Store.Put(store.Snapshots, snap.ID, snap); err == nil {
		undo.add(func(context.Context) error { return v.Store.Delete(store.Snapshots, snap.ID) })
		err = fpForkSnapshot.Inject()
	}
	if err != nil {
		for _, uerr := range undo.run(ctx) {
			v.Log.Warn("fork: undo the snapshot", "snapshot", snap.ID, "err", uerr)
		}
		return snap, err
	}
	return snap, nil
}

// forkChildren starts the children, at most plan.Parallel at once: restores
// are CPU-bound in the VMM, so more only adds latency.
func (v *Verbs) forkChildren(ctx context.Context, snap snapshot.Record, parent sandbox.Record, plan ForkPlan) []ForkResult {
	out := make([]ForkResult, plan.Count)
	sem := make(chan struct{}, max(plan.Parallel, 1))
	var wg sync.WaitGroup
	for i := range out {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			out[i].Sandbox, out[i].Err = plan.Child(ctx, snap, parent)
		}()
	}
	wg.Wait()
	return out
}
