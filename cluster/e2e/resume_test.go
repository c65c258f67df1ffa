package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/aenvdtest"
	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/snapshot/repo/posix"
	"github.com/redis/go-redis/v9"
)

// twoOnOneNode picks a node holding at least two of ids and two of its
// sandboxes (nine creates over three nodes leave one such node at least).
func (c *cluster) twoOnOneNode(t *testing.T, ids []string) (int, string, string) {
	t.Helper()
	where := c.where(t)
	for i, name := range c.names {
		var on []string
		for _, id := range ids {
			if where[id] == name {
				on = append(on, id)
			}
		}
		if len(on) >= 2 {
			return i, on[0], on[1]
		}
	}
	t.Fatalf("no node holds two of %v (%v)", ids, where)
	return 0, "", ""
}

// waitUploaded waits for the paused sandbox's manifest in the repository
// the nodes share: only then can another node resume it.
func (c *cluster) waitUploaded(t *testing.T, id string) {
	t.Helper()
	r, err := posix.Open(c.repoDir, repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for {
		names, err := r.Manifests(ctx)
		if err != nil {
			t.Fatalf("manifests of the shared repository: %v", err)
		}
		for _, n := range names {
			if strings.HasPrefix(n, "sandbox-"+id+"-") {
				return
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the pause of %s was never committed to the shared repository (manifests %v)", id, names)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// waitFound waits until the scheduler found a lost binding again (a
// roster of its node, back, reported it): the leader has reconciled that
// node's roster.
func (c *cluster) waitFound(t *testing.T, id string) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: c.redis.Addr})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		lost, err := rdb.HExists(ctx, "aenv:bind:"+id, "lost").Result()
		if err == nil && !lost {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("binding of %s still lost after its node came back (%v)", id, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// state is a sandbox's state through the gateway.
func (c *cluster) state(t *testing.T, id string) string {
	t.Helper()
	code, b, _ := c.call(t, "GET", "/sandboxes/"+id, "")
	var s struct {
		State string `json:"state"`
	}
	if code != http.StatusOK || json.Unmarshal(b, &s) != nil {
		t.Fatalf("GET /sandboxes/%s through the gateway: %d %s", id, code, b)
	}
	return s.State
}

// crashDroppingCopy starts the dead node n with the removal of a stale
// copy armed to crash, and waits for that crash (before or after its
// /health answered: the removal follows the scheduler's first answer).
func (c *cluster) crashDroppingCopy(ctx context.Context, t *testing.T, n *aenvdtest.Node) {
	t.Helper()
	_ = n.RestartWith(ctx, 3*time.Minute, failpoint.EnvVar+"=orchestrator/dropcopy/recorded=crash")
	st, err := n.WaitExit(2 * time.Minute)
	if err != nil {
		t.Fatalf("the revived node never reached the removal of its stale copy: %v\n%s", err, n.Logs())
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("the revived node ended with %v, want SIGKILL from orchestrator/dropcopy/recorded\n%s", st, n.Logs())
	}
}

// checkDropped fails unless node i, back from the dead, no longer holds
// its stale copy of id (resumed on another node meanwhile): neither of its
// own lists (GET /sandboxes, running ones; GET /v2/sandboxes, paused too)
// shows it and its directory for it is gone. A revived node answers
// requests only once the scheduler answered its registration and the
// copies it named are removed, so this holds from its first answer.
func (c *cluster) checkDropped(t *testing.T, i int, id string) {
	t.Helper()
	n := c.nodes[i]
	dir := filepath.Join(n.DataDir, "sandboxes", id)
	v1, b1 := nodeLists(n, "/sandboxes", id)
	v2, b2 := nodeLists(n, "/v2/sandboxes", id)
	if _, serr := os.Stat(dir); v1 || v2 || !os.IsNotExist(serr) {
		t.Fatalf("%s answers with its stale copy of %s (resumed elsewhere): GET /sandboxes %s; GET /v2/sandboxes %s; %s: %v",
			c.names[i], id, b1, b2, dir, serr)
	}
}

// nodeLists is a node's own list at path showing id (or failing: then it
// may); the answer comes back for the failure message.
func nodeLists(n *aenvdtest.Node, path, id string) (bool, string) {
	code, b, _, err := n.Call("GET", path, n.Key, "")
	var list []struct {
		SandboxID string `json:"sandboxID"`
	}
	if err != nil || code != http.StatusOK || json.Unmarshal(b, &list) != nil {
		return true, fmt.Sprintf("%d %s (err %v)", code, b, err)
	}
	for _, s := range list {
		if s.SandboxID == id {
			return true, string(b)
		}
	}
	return false, string(b)
}
