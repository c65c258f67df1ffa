package nodeagent

import (
	"context"
	"slices"
	"sync"

	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
)

// A node back from the dead may hold sandboxes that another node resumed
// meanwhile from the repository: the scheduler keeps their bindings with
// that node and names them stale in its reply to this node's registration
// or heartbeat. The node removes its copies, which no client reaches any
// more. Only the scheduler's word removes anything: a node that cannot
// reach it keeps every copy.

// drops tracks removals in progress, so that one runs once per sandbox and
// the roster leaves it out meanwhile.
type drops struct {
	mu   sync.Mutex
	busy map[string]bool
	wg   sync.WaitGroup
}

func (d *drops) isBusy(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.busy[id]
}

// start claims id; false when a removal of it already runs.
func (d *drops) start(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.busy[id] {
		return false
	}
	if d.busy == nil {
		d.busy = map[string]bool{}
	}
	d.busy[id] = true
	d.wg.Add(1)
	return true
}

func (d *drops) done(id string) {
	d.mu.Lock()
	delete(d.busy, id)
	d.mu.Unlock()
	d.wg.Done()
}

func (d *drops) wait() { d.wg.Wait() }

// dropStale removes, in the background (a removal stops a VM and deletes
// files; the heartbeats go on meanwhile), the copies the scheduler named
// stale among those of the roster st it answered.
func (a *Agent) dropStale(ctx context.Context, st *pb.NodeStatus, stale []string) {
	for _, id := range stale {
		if !slices.ContainsFunc(st.GetRoster(), func(e *pb.RosterEntry) bool { return e.GetSandboxId() == id }) {
			continue // not ours to judge: never reported
		}
		if !a.drops.start(id) {
			continue
		}
		go func() {
			defer a.drops.done(id)
			a.dropOne(context.WithoutCancel(ctx), id)
		}()
	}
}

func (a *Agent) dropOne(ctx context.Context, id string) {
	state, err := a.opts.Source.DropCopy(ctx, id)
	switch {
	case err != nil:
		a.log.Warn("remove stale copy of a sandbox bound to another node", "sandbox", id, "err", err)
	case state == "running":
		// A VM still ran (aenvd restarted alone and re-adopted it) while
		// the sandbox was resumed elsewhere: a split brain. Clients reach
		// the other copy; this one is killed.
		a.log.Warn("split brain: killed a running copy of a sandbox bound to another node", "sandbox", id)
	default:
		a.log.Info("removed stale copy of a sandbox resumed on another node", "sandbox", id, "state", state)
	}
}
