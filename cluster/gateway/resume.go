package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
)

// isResume is a call that resumes a paused sandbox: E2B's connect (the
// SDK's is /v2/sandboxes/{id}/connect), or the older resume.
func isResume(r *http.Request, id string) bool {
	if r.Method != http.MethodPost {
		return false
	}
	p := strings.TrimPrefix(r.URL.Path, "/v2")
	return p == "/sandboxes/"+id+"/connect" || p == "/sandboxes/"+id+"/resume"
}

// keyLocks serializes the resumes of one sandbox in this gateway, so two
// connects at once bring it to one node, not two (and ask the scheduler's
// claim, which serializes them across gateways, once).
type keyLocks struct {
	mu    sync.Mutex
	locks map[string]*keyLock
}

type keyLock struct {
	mu    sync.Mutex
	users int
}

func (k *keyLocks) lock(id string) func() {
	k.mu.Lock()
	if k.locks == nil {
		k.locks = map[string]*keyLock{}
	}
	l := k.locks[id]
	if l == nil {
		l = &keyLock{}
		k.locks[id] = l
	}
	l.users++
	k.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		k.mu.Lock()
		if l.users--; l.users == 0 {
			delete(k.locks, id)
		}
		k.mu.Unlock()
	}
}

// resume answers a connect (or resume) of sandbox id. A sandbox whose node
// the scheduler holds down is placed on a live node, which brings its
// paused state from the repository the nodes share, and is bound there.
// Only a node the scheduler marked down (missed heartbeats) or that left
// is given up on: a node merely slow to answer may still hold the sandbox
// running, and resuming it elsewhere would make two of it.
func (g *Gateway) resume(w http.ResponseWriter, r *http.Request, id string) {
	unlock := g.resuming.lock(id)
	defer unlock()
	g.forget(id) // a cached node may be the dead one
	u, err := g.nodeOf(r.Context(), id)
	var down errNodeDown
	switch {
	case err == nil:
		g.forward(w, r, u, id, true)
	case errors.As(err, &down):
		g.resumeDown(w, r, id)
	default:
		g.failLookup(w, id, err)
	}
}

// resumeClaimTTL bounds how long a gateway that died mid-resume holds up
// the others: its claim on the sandbox expires then.
const resumeClaimTTL = 2 * time.Minute

// resumeDown resumes a down node's sandbox under the scheduler's claim on
// it, so gateway replicas resume it once between them: one that waited for
// another's claim finds the sandbox bound to its new node and forwards.
func (g *Gateway) resumeDown(w http.ResponseWriter, r *http.Request, id string) {
	release, err := g.claimResume(r.Context(), id)
	if err != nil {
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("resume sandbox %s: %v", id, err))
		return
	}
	defer release()
	g.forget(id)
	u, err := g.nodeOf(r.Context(), id)
	var down errNodeDown
	switch {
	case err == nil: // resumed meanwhile through another gateway
		g.forward(w, r, u, id, true)
	case errors.As(err, &down):
		g.resumeElsewhere(w, r, id, down.node)
	default:
		g.failLookup(w, id, err)
	}
}

// claimResume waits until the scheduler grants this request the resume of
// id (another gateway's ends with its release or its TTL), or ctx ends.
func (g *Gateway) claimResume(ctx context.Context, id string) (release func(), err error) {
	var tok [12]byte
	_, _ = rand.Read(tok[:])
	holder := hex.EncodeToString(tok[:])
	req := &pb.ClaimResumeRequest{SandboxId: id, Holder: holder, TtlMs: resumeClaimTTL.Milliseconds()}
	for {
		c, err := g.sched.ClaimResume(ctx, req)
		if err != nil {
			return nil, fmt.Errorf("claim it at the scheduler: %w", err)
		}
		if c.GetGranted() {
			return func() {
				_, err := g.sched.ReleaseResume(context.WithoutCancel(ctx), &pb.ReleaseResumeRequest{SandboxId: id, Holder: holder})
				if err != nil {
					g.log.Warn("release a resume claim (it expires by itself)", "sandbox", id, "err", err)
				}
			}, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("another gateway is resuming it: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// resumeElsewhere tries live nodes (up to MaxCreateAttempts), skipping one
// unreachable or refusing for capacity. A node's 404 means the repository
// holds no paused state of the sandbox (the nodes share it): asking
// another would answer the same.
func (g *Gateway) resumeElsewhere(w http.ResponseWriter, r *http.Request, id, lost string) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	exclude := []string{lost}
	for attempt := 0; attempt < g.opts.MaxCreateAttempts; attempt++ {
		pl, err := g.place(r.Context(), &pb.Resources{}, exclude, id)
		if err != nil {
			g.failPlace(w, fmt.Errorf("resume sandbox %s of down node %s: %w", id, lost, err))
			return
		}
		name := pl.name()
		resp, err := g.send(r, pl.url(), body)
		if err != nil {
			g.log.Warn("resume elsewhere: node unreachable; trying another", "sandbox", id, "node", name, "err", err)
			g.unreserve(r.Context(), pl)
			exclude = append(exclude, name)
			continue
		}
		resp = bufferResponse(resp)
		switch {
		case resp.StatusCode == http.StatusServiceUnavailable:
			g.log.Info("resume elsewhere refused for capacity; trying another node", "sandbox", id, "node", name)
			g.unreserve(r.Context(), pl)
			resp.Body.Close()
			exclude = append(exclude, name)
			continue
		case resp.StatusCode == http.StatusNotFound:
			g.unreserve(r.Context(), pl)
			resp.Body.Close()
			writeError(w, http.StatusNotFound, fmt.Sprintf("sandbox %s: its node %s is down, and the repository the nodes "+
				"share holds no paused state of it (a sandbox resumes on another node only once its pause was uploaded)", id, lost))
			return
		case resp.StatusCode/100 == 2:
			if err := g.bind(r.Context(), id, pl.node, pl.reservation); err != nil {
				// The node's roster binds it within a heartbeat.
				g.log.Error("bind a sandbox resumed elsewhere", "sandbox", id, "node", name, "err", err)
			}
			g.log.Info("resumed a down node's sandbox elsewhere", "sandbox", id, "from", lost, "to", name)
		default:
			g.unreserve(r.Context(), pl)
		}
		relay(w, resp)
		return
	}
	writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("sandbox %s: its node %s is down and no live node took its resume (tried %s)",
		id, lost, strings.Join(exclude[1:], ", ")))
}
