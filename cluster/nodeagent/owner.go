package nodeagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/snapshot/repo/upload"
)

// Ownership (cluster/scheduler owner.go): each scheduler reply gives the
// node the ownership generation of every roster sandbox bound to it and a
// lease. The node keeps them (in Options.OwnershipFile, so a restarted node
// has its own records) and takes a record as proof that it owns a sandbox
// only while its lease runs: the scheduler moves a sandbox only after a
// longer silence. Commits of pauses to the repository are checked with the
// scheduler against the generation held when the pause was queued (Fence).

// grant is one sandbox's ownership as last told.
type grant struct {
	Gen   int64     `json:"gen"`
	Until time.Time `json:"until"`
}

// owners is the node's ownership records.
type owners struct {
	mu   sync.Mutex
	m    map[string]grant
	path string // "" keeps them in memory only
}

// load reads the records a previous process wrote (none: empty).
func (o *owners) load() error {
	o.m = map[string]grant{}
	if o.path == "" {
		return nil
	}
	b, err := os.ReadFile(o.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err == nil {
		err = json.Unmarshal(b, &o.m)
	}
	if err != nil {
		o.m = map[string]grant{}
		return fmt.Errorf("read ownership records %s: %w", o.path, err)
	}
	return nil
}

// set replaces the records by a scheduler's answer: what it does not list
// is no longer this node's.
func (o *owners) set(owned map[string]int64, until time.Time) error {
	m := make(map[string]grant, len(owned))
	for id, gen := range owned {
		m[id] = grant{Gen: gen, Until: until}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.m = m
	if o.path == "" {
		return nil
	}
	b, err := json.Marshal(m)
	if err == nil {
		err = atomicfile.WriteFile(o.path, b, 0o600)
	}
	if err != nil {
		return fmt.Errorf("write ownership records %s: %w", o.path, err)
	}
	return nil
}

func (o *owners) get(id string) (grant, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	g, ok := o.m[id]
	return g, ok
}

// Generation is the ownership generation this node was last told for id
// (0: none recorded).
func (a *Agent) Generation(id string) int64 {
	g, _ := a.owners.get(id)
	return g.Gen
}

// Owns tells whether the node's own records prove it owns id now: told so
// by the scheduler (bound here, or reported here and bound nowhere yet),
// with the lease still running.
func (a *Agent) Owns(id string) bool {
	g, ok := a.owners.get(id)
	return ok && time.Now().Before(g.Until)
}

// recordOwned keeps a reply's ownership and renews the node's proof
// (proof.go); sent is when the request left.
func (a *Agent) recordOwned(owned map[string]int64, leaseMS int64, stale []string, st *pb.NodeStatus, sent time.Time) {
	lease := time.Duration(leaseMS) * time.Millisecond
	if lease <= 0 {
		lease = a.leaseFallback()
	}
	until := sent.Add(lease)
	if err := a.owners.set(owned, until); err != nil {
		a.log.Warn("keep ownership records", "err", err)
	}
	a.proof.renew(until, stale, st.GetRoster())
}

// CheckOwner asks the scheduler whether this node owns sandbox id at
// generation gen (0: any).
func (a *Agent) CheckOwner(ctx context.Context, id string, gen int64) (*pb.CheckOwnerResponse, error) {
	var last error
	for range a.clients {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		r, err := a.clients[a.cur].CheckOwner(cctx, &pb.CheckOwnerRequest{SandboxId: id, Node: a.opts.Name, Gen: gen})
		cancel()
		if err == nil {
			return r, nil
		}
		last = err
		a.next()
	}
	return nil, fmt.Errorf("check owner of %s: %w", id, last)
}

// Fence is the repository uploader's fence (upload.Fence) for a cluster
// node: a job of a sandbox's pause is stamped with the node's ownership
// generation of the sandbox and committed only if the scheduler still
// binds the sandbox here at that generation. Other jobs (snapshots,
// templates: new names only this node writes) pass.
type Fence struct {
	Agent *Agent
	// SandboxOf names the sandbox a pause's manifest belongs to (false for
	// other manifests).
	SandboxOf func(manifest string) (string, bool)
}

// Stamp implements upload.Fence.
func (f Fence) Stamp(name string) string {
	id, ok := f.SandboxOf(name)
	if !ok {
		return ""
	}
	return strconv.FormatInt(f.Agent.Generation(id), 10)
}

// Check implements upload.Fence. A scheduler that does not answer delays
// the commit (retried); one that names another owner refuses it for good.
func (f Fence) Check(ctx context.Context, name, stamp string) error {
	id, ok := f.SandboxOf(name)
	if !ok {
		return nil
	}
	gen, _ := strconv.ParseInt(stamp, 10, 64)
	r, err := f.Agent.CheckOwner(ctx, id, gen)
	if err != nil {
		return err
	}
	if r.GetHolder() == "" {
		// Not bound yet (a roster binds it within a heartbeat) or no longer
		// (killed: its upload is cancelled): no owner to defer to; retried.
		return fmt.Errorf("sandbox %s is bound to no node yet", id)
	}
	if !r.GetOwner() {
		f.Agent.log.Warn("not committing a pause of a sandbox this node no longer owns", "sandbox", id, "manifest", name,
			"gen", gen, "holder", r.GetHolder(), "holder_gen", r.GetGen())
		return fmt.Errorf("sandbox %s is bound to %q at generation %d, not here at %d: %w", id, r.GetHolder(), r.GetGen(), gen, upload.ErrFenced)
	}
	return nil
}

// Proven lists the roster sandboxes the node's own records prove it owns
// now (what a node that cannot reach the scheduler may vouch for).
func (a *Agent) Proven() []string {
	var out []string
	for _, s := range a.opts.Source.Usage().Roster {
		if a.Owns(s.ID) {
			out = append(out, s.ID)
		}
	}
	return out
}
