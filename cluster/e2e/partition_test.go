package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/aenvdtest"
	"github.com/agentenv/agentenv/guest/agent/agentclient"
	"github.com/agentenv/agentenv/internal/testutil/netcut"
	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/snapshot/repo/posix"
	"github.com/redis/go-redis/v9"
)

// partitionFor is how long the scheduler stays cut off from the node.
const partitionFor = time.Minute

// TestPartition: node-a stays alive (its VMs run) but its connections to
// both schedulers go silent for a minute (a forwarder on loopback that
// holds every byte, see internal/testutil/netcut; the gateway and the test
// still reach the node). Of its two sandboxes, one paused and uploaded,
// one running: once the scheduler holds the node down, the paused one is
// resumed through the gateway on another node and written to. Meanwhile
// node-a refuses every request on both (it cannot prove it still owns
// them: 503, fenced), keeps its copy of the moved one paused and commits
// nothing to the repository. Healed, node-a removes its stale copy, the
// moved sandbox stays bound where it resumed with its files, and node-a's
// running sandbox answers again, its file intact.
func TestPartition(t *testing.T) {
	var links []*netcut.Link
	const x = 0 // node-a
	c := startClusterWith(t, func(i int, addrs []string) []string {
		if i != x {
			return addrs
		}
		var via []string
		for _, a := range addrs {
			l, err := netcut.Listen(a)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.Close() })
			links = append(links, l)
			via = append(via, l.Addr())
		}
		return via
	})
	xn, xname := c.nodes[x], c.names[x]
	paused, running := c.twoOn(t, x)
	c.sh(t, paused, "echo before > /root/p.txt")
	c.sh(t, running, "echo mine > /root/r.txt")
	if code, b, _ := c.call(t, "POST", "/sandboxes/"+paused+"/pause", ""); code != http.StatusNoContent {
		t.Fatalf("pause %s through the gateway: %d %s", paused, code, b)
	}
	c.waitUploaded(t, paused)
	committed := c.pausesOf(t, paused)

	cut := time.Now()
	for _, l := range links {
		l.Cut()
	}
	c.waitNodes(t, 2)
	t.Logf("the scheduler held %s down %v into the partition", xname, time.Since(cut).Round(time.Millisecond))
	refused(t, xn, xname, [][2]string{{"GET", "/sandboxes/" + running}, {"GET", "/sandboxes/" + paused},
		{"POST", "/sandboxes/" + paused + "/connect"}})
	if resp, err := aenvdtest.AgentClient(running).Get(xn.Proxy + "/health"); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("%s's proxy to the agent of its sandbox %s while cut off: %v %v, want 503", xname, running, resp, err)
	} else {
		resp.Body.Close()
	}

	// Through the gateway, a call on the down node's running sandbox is not
	// sent there (the scheduler holds the node down).
	if code, b, _ := c.call(t, "GET", "/sandboxes/"+running, ""); code != http.StatusBadGateway {
		t.Fatalf("GET /sandboxes/%s through the gateway while %s is held down: %d %s, want 502", running, xname, code, b)
	}
	moved := c.moveWhileCut(t, x, paused, running, cut, committed)

	for _, l := range links {
		l.Restore()
	}
	t.Logf("partition healed after %v", time.Since(cut).Round(time.Millisecond))
	c.waitNodes(t, 3)
	c.checkHealed(t, x, paused, running, moved, committed)
	for _, id := range []string{paused, running} {
		if code, b, _ := c.call(t, "DELETE", "/sandboxes/"+id, ""); code != http.StatusNoContent {
			t.Fatalf("kill %s through the gateway: %d %s", id, code, b)
		}
	}
}

// twoOn creates two sandboxes through the gateway that land on node i (the
// other nodes drained meanwhile).
func (c *cluster) twoOn(t *testing.T, i int) (string, string) {
	t.Helper()
	for j, name := range c.names {
		if j != i {
			c.aenv(t, "node", "drain", name)
		}
	}
	a, b := c.create(t), c.create(t)
	for j, name := range c.names {
		if j != i {
			c.aenv(t, "node", "undrain", name)
		}
	}
	if w := c.where(t); w[a] != c.names[i] || w[b] != c.names[i] {
		t.Fatalf("creates with the other nodes drained: %s on %q, %s on %q; want %s", a, w[a], b, w[b], c.names[i])
	}
	return a, b
}

// sh runs a bash script as root in sandbox id through the gateway's proxy.
func (c *cluster) sh(t *testing.T, id, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, stderr, code, err := agentclient.RunWith(ctx, c.gateway, aenvdtest.AgentClient(id),
		[]agentclient.Option{agentclient.WithUser("root")}, "/bin/bash", "-c", script)
	if err != nil || code != 0 {
		t.Fatalf("%q in %s through the gateway: exit %d %v %s", script, id, code, err, stderr)
	}
	return string(out)
}

// refused fails unless node n answers every call with 503 naming the fence
// (the calls run at once: each waits for the scheduler before its answer).
func refused(t *testing.T, n *aenvdtest.Node, name string, calls [][2]string) {
	t.Helper()
	errs := make([]string, len(calls))
	var wg sync.WaitGroup
	for i, call := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, b, h, err := n.Call(call[0], call[1], n.Key, "")
			if err != nil || code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" ||
				!strings.Contains(string(b), "cannot prove it still owns") {
				errs[i] = fmt.Sprintf("%s %s on %s: %d %s %v; want 503 (fenced)", call[0], call[1], name, code, b, err)
			}
		}()
	}
	wg.Wait()
	for _, e := range errs {
		if e != "" {
			t.Fatal(e)
		}
	}
}

// boundTo is the node the scheduler binds id to (Redis).
func (c *cluster) boundTo(t *testing.T, id string) string {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: c.redis.Addr})
	defer rdb.Close()
	node, err := rdb.HGet(context.Background(), "aenv:bind:"+id, "node").Result()
	if err != nil {
		t.Fatalf("binding of %s: %v", id, err)
	}
	return node
}

// stateOn is the state of id in node n's own list ("" when not listed).
func stateOn(t *testing.T, n *aenvdtest.Node, id string) string {
	t.Helper()
	code, b, _, err := n.Call("GET", "/v2/sandboxes", n.Key, "")
	var list []struct {
		SandboxID string `json:"sandboxID"`
		State     string `json:"state"`
	}
	if err != nil || code != http.StatusOK || json.Unmarshal(b, &list) != nil {
		t.Fatalf("GET /v2/sandboxes: %d %s %v", code, b, err)
	}
	for _, s := range list {
		if s.SandboxID == id {
			return s.State
		}
	}
	return ""
}

// pausesOf reads the manifests of id's pauses in the shared repository,
// by name, as JSON.
func (c *cluster) pausesOf(t *testing.T, id string) map[string]string {
	t.Helper()
	r, err := posix.Open(c.repoDir, repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	names, err := r.Manifests(ctx)
	if err != nil {
		t.Fatalf("manifests of the shared repository: %v", err)
	}
	out := map[string]string{}
	for _, n := range names {
		if !strings.HasPrefix(n, "sandbox-"+id+"-") {
			continue
		}
		m, err := r.Manifest(ctx, n)
		if err != nil {
			t.Fatalf("manifest %s: %v", n, err)
		}
		b, _ := json.Marshal(m)
		out[n] = string(b)
	}
	if len(out) == 0 {
		t.Fatalf("no pause of %s in the shared repository (%v)", id, names)
	}
	return out
}

func equalPauses(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// waitDropped waits until node i, healed, removed its stale copy of id
// (the scheduler's first answer names it; the removal runs in the
// background): gone from its lists and its directory.
func (c *cluster) waitDropped(t *testing.T, i int, id string) {
	t.Helper()
	n := c.nodes[i]
	dir := filepath.Join(n.DataDir, "sandboxes", id)
	deadline := time.Now().Add(time.Minute)
	for {
		v1, _ := nodeLists(n, "/sandboxes", id)
		v2, b2 := nodeLists(n, "/v2/sandboxes", id)
		_, serr := os.Stat(dir)
		if !v1 && !v2 && os.IsNotExist(serr) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still holds its stale copy of %s a minute after the heal: %s; %s: %v", c.names[i], id, b2, dir, serr)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// moveWhileCut resumes paused (node x's, held down) on another node through
// the gateway and writes a file in it; until the end of the partition's
// minute node x serves neither of its sandboxes, keeps its copy of the
// moved one paused and commits nothing. It returns the new node.
func (c *cluster) moveWhileCut(t *testing.T, x int, paused, running string, cut time.Time, committed map[string]string) string {
	t.Helper()
	xn, xname := c.nodes[x], c.names[x]
	// The paused sandbox resumes on another node through the gateway.
	if code, b, _ := c.call(t, "POST", "/sandboxes/"+paused+"/connect", `{"timeout":600}`); code/100 != 2 {
		t.Fatalf("connect of %s, paused on %s held down, through the gateway: %d %s", paused, xname, code, b)
	}
	moved := c.boundTo(t, paused)
	if moved == xname || moved == "" {
		t.Fatalf("%s resumed on %q, want another node than %s", paused, moved, xname)
	}
	if out := c.sh(t, paused, "cat /root/p.txt; echo after > /root/p2.txt"); out != "before\n" {
		t.Fatalf("%s resumed on %s: its file reads %q", paused, moved, out)
	}
	t.Logf("%s resumed on %s %v into the partition", paused, moved, time.Since(cut).Round(time.Millisecond))

	time.Sleep(time.Until(cut.Add(partitionFor - 10*time.Second))) // the rest of the minute
	refused(t, xn, xname, [][2]string{{"GET", "/sandboxes/" + paused}, {"POST", "/sandboxes/" + paused + "/connect"},
		{"GET", "/sandboxes/" + running}})
	if st := stateOn(t, xn, paused); st != "paused" {
		t.Fatalf("%s's own copy of %s (moved to %s) is %q while cut off, want still paused", xname, paused, moved, st)
	}
	if got := c.pausesOf(t, paused); !equalPauses(got, committed) {
		t.Fatalf("pauses of %s in the repository changed while %s was cut off: %v, was %v", paused, xname, got, committed)
	}

	return moved
}

// checkHealed checks the cluster once node x is back: its stale copy of
// paused is gone, paused runs on moved alone with both its files, and
// running, never moved, answers from node x as before.
func (c *cluster) checkHealed(t *testing.T, x int, paused, running, moved string, committed map[string]string) {
	t.Helper()
	xn, xname := c.nodes[x], c.names[x]
	c.waitDropped(t, x, paused)
	if code, b, _, err := xn.Call("GET", "/sandboxes/"+paused, xn.Key, ""); err != nil || code != http.StatusNotFound {
		t.Fatalf("%s, healed, on %s (moved to %s): %d %s %v, want 404", xname, paused, moved, code, b, err)
	}
	if got := c.boundTo(t, paused); got != moved {
		t.Fatalf("%s after the heal is bound to %q, want %s where it resumed", paused, got, moved)
	}
	if w := c.where(t); w[paused] != moved {
		t.Fatalf("%s after the heal runs on %q, want %s alone", paused, w[paused], moved)
	}
	c.reachable(t, paused)
	if out := c.sh(t, paused, "cat /root/p.txt /root/p2.txt"); out != "before\nafter\n" {
		t.Fatalf("%s through the gateway after the heal: %q", paused, out)
	}
	c.waitFound(t, running)
	if got := c.boundTo(t, running); got != xname {
		t.Fatalf("%s (never moved) after the heal is bound to %q, want %s", running, got, xname)
	}
	c.reachable(t, running)
	if out := c.sh(t, running, "cat /root/r.txt"); out != "mine\n" {
		t.Fatalf("%s after the heal: %q", running, out)
	}
	if code, b, _, err := xn.Call("GET", "/sandboxes/"+running, xn.Key, ""); err != nil || code != http.StatusOK {
		t.Fatalf("%s's own sandbox %s after the heal: %d %s %v", xname, running, code, b, err)
	}
	if got := c.pausesOf(t, paused); !equalPauses(got, committed) {
		t.Fatalf("pauses of %s in the repository after the heal: %v, was %v", paused, got, committed)
	}
	if !strings.Contains(xn.Logs(), "refused a request on a sandbox this node cannot prove it owns") {
		t.Fatalf("%s logged no refusal", xname)
	}
}
