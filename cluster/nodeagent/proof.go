package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
)

// A node cut off from the scheduler keeps its VMs running, but the cluster
// may meanwhile have marked it down and resumed its paused sandboxes on
// other nodes from the repository. From then on, answering for such a
// sandbox (serving its agent, resuming its paused copy) could make two
// copies. So the node answers for a sandbox only while it can prove it
// still owns it: its records (owner.go) say the scheduler, within the
// lease, named the sandbox bound here or bound nowhere yet; or the
// sandbox is newer than the roster of the last answer (made or resumed
// here since: the scheduler has judged nothing about it) and that answer's
// lease runs. A sandbox named stale, or bound to another node, is not
// proven. The scheduler moves a node's sandboxes only after DownAfter of
// silence and the lease is half of it, so a proof never covers a moved
// sandbox. An unproven request waits a little for the scheduler's next
// answer and is then refused; the copy is kept (the answer after a
// partition heals decides).

// ErrUnproven is a sandbox this node cannot prove it still owns: no answer
// from the scheduler within the lease. The node's copy is kept (the VM
// runs on); the answer after the partition heals decides.
var ErrUnproven = errors.New("this node cannot prove it still owns the sandbox (fenced: no answer from the cluster scheduler within the lease)")

// ErrMoved is a sandbox the scheduler binds to another node: this node's
// copy is stale and being removed.
var ErrMoved = errors.New("the sandbox is bound to another node; this node's copy is stale")

// proof is what the last scheduler answer vouches for.
type proof struct {
	mu      sync.Mutex
	until   time.Time       // the answer's lease
	heard   time.Time       // when it came
	stale   map[string]bool // the sandboxes it named stale
	covered map[string]bool // the roster its request reported
	renewed chan struct{}   // closed (and replaced) at every answer
}

// renew records an answer to a request that reported roster: its lease
// runs until until and it named stale bound to other nodes.
func (p *proof) renew(until time.Time, stale []string, roster []*pb.RosterEntry) {
	m := make(map[string]bool, len(stale))
	for _, id := range stale {
		m[id] = true
	}
	c := make(map[string]bool, len(roster))
	for _, e := range roster {
		c[e.GetSandboxId()] = true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.until, p.heard, p.stale, p.covered = until, time.Now(), m, c
	if p.renewed != nil {
		close(p.renewed)
	}
	p.renewed = make(chan struct{})
}

// state is the proof of id now: whether it is newer than the last
// answered roster with that answer's lease running, whether it was named
// stale, when the scheduler last answered, and a channel closed at the
// next answer.
func (p *proof) state(id string) (newer, stale bool, heard time.Time, next <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.renewed == nil {
		p.renewed = make(chan struct{})
	}
	return time.Now().Before(p.until) && !p.covered[id], p.stale[id], p.heard, p.renewed
}

// leaseFallback is the lease of an answer that carries none (a scheduler
// that predates leases): a little over two heartbeats.
func (a *Agent) leaseFallback() time.Duration { return a.interval*2 + a.interval/2 }

// Vouch returns nil once this node may answer for sandbox id; it waits for
// the scheduler's next answer while the node cannot prove it owns id, up
// to ctx's end. A sandbox named stale (or being removed as such) is
// refused at once with ErrMoved, one still unproven when ctx ends with
// ErrUnproven.
func (a *Agent) Vouch(ctx context.Context, id string) error {
	for {
		newer, stale, heard, next := a.proof.state(id)
		if stale || a.drops.isBusy(id) {
			return fmt.Errorf("sandbox %s on node %s: %w", id, a.opts.Name, ErrMoved)
		}
		if newer || a.Owns(id) {
			return nil
		}
		select {
		case <-next:
		case <-ctx.Done():
			last := "never since this node started"
			if !heard.IsZero() {
				last = heard.UTC().Format(time.RFC3339) + " (" + time.Since(heard).Round(time.Second).String() + " ago)"
			}
			return fmt.Errorf("sandbox %s on node %s: %w; last answer %s", id, a.opts.Name, ErrUnproven, last)
		}
	}
}
