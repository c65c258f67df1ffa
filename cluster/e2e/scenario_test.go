package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/aenvdtest"
)

// runScenario runs scenario.mjs with E2B's SDK pointed at the gateway and
// returns the ids of the sandboxes it made.
func runScenario(t *testing.T, c *cluster, count int, tag string, env ...string) []string {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is not installed; the E2B SDK scenario needs Node.js 20+ (scripts/setup.sh installs it)")
	}
	sdk := filepath.Join(moduleRoot(), "guest", "agent", "e2e", "sdk-"+sdkVersion)
	if _, err := os.Stat(filepath.Join(sdk, "node_modules", "e2b", "package.json")); err != nil {
		t.Fatalf("E2B SDK %s is not installed in %s: run .ci/setup.d/30-e2b-sdk.sh", sdkVersion, sdk)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join(moduleRoot(), "cluster", "e2e", "scenario.mjs"))
	cmd.Env = append(os.Environ(), "E2B_API_URL="+c.gateway, "E2B_SANDBOX_URL="+c.gateway, "E2B_API_KEY="+aenvdtest.Key,
		"AENV_E2B_SDK_DIR="+sdk, "AENV_CREATE="+itoa(count), "AENV_TAG="+tag)
	cmd.Env = append(cmd.Env, env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	t.Logf("scenario output:\n%s", out.String())
	if err != nil || !strings.Contains(out.String(), "scenario passed") {
		t.Fatalf("scenario through the gateway failed: %v", err)
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if rest, ok := strings.CutPrefix(line, "ids "); ok {
			var ids []string
			if err := json.Unmarshal([]byte(rest), &ids); err != nil {
				t.Fatal(err)
			}
			return ids
		}
	}
	if len(env) == 0 {
		t.Fatal("the scenario printed no ids")
	}
	return nil
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func TestCluster(t *testing.T) {
	c := startCluster(t)
	t0 := time.Now()
	ids := runScenario(t, c, 9, "e2e-"+itoa(os.Getpid()))
	t.Logf("the SDK scenario (9 sandboxes) took %v", time.Since(t0).Round(time.Millisecond))

	where := c.where(t)
	perNode := map[string]int{}
	for _, id := range ids {
		perNode[where[id]]++
	}
	for _, n := range c.names {
		if perNode[n] == 0 {
			t.Fatalf("creates through the gateway: %v per node, none on %s", perNode, n)
		}
	}
	t.Logf("sandboxes per node: %v", perNode)

	// The gateway's pages cover the three nodes with a stable token.
	seen := map[string]bool{}
	next, pages := "", 0
	for {
		q := "/v2/sandboxes?limit=4"
		if next != "" {
			q += "&nextToken=" + next
		}
		code, b, h := c.call(t, "GET", q, "")
		var page []struct {
			SandboxID string `json:"sandboxID"`
		}
		if code != 200 || json.Unmarshal(b, &page) != nil {
			t.Fatalf("GET %s: %d %s", q, code, b)
		}
		for _, s := range page {
			if seen[s.SandboxID] {
				t.Fatalf("page %d repeats %s", pages, s.SandboxID)
			}
			seen[s.SandboxID] = true
		}
		pages++
		if next = h.Get("X-Next-Token"); next == "" {
			break
		}
	}
	for _, id := range ids {
		if !seen[id] {
			t.Fatalf("%s missing from the paginated list (%d pages)", id, pages)
		}
	}
	t.Run("DashboardListsEveryNode", func(t *testing.T) { dashboardLists(t, c, ids) })

	// kill -9 of one scheduler: the other keeps placing and routing.
	s1 := c.schedulers[0]
	if err := s1.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = s1.cmd.Wait()
	for _, id := range ids[:3] {
		c.reachable(t, id)
	}
	after := c.create(t)
	c.reachable(t, after)

	// Redis restarts (append-only persistence): bindings survive.
	c.redis.Restart()
	for _, id := range append(ids[3:], after) {
		c.reachable(t, id)
	}

	// A node killed with SIGKILL goes down (no heartbeat) and new creates go
	// to the others; its sandbox paused (and uploaded to the repository the
	// nodes share) resumes on another node at the SDK's connect, one never
	// paused answers a clear 404; restarted, the node takes its VMs over
	// and comes back, and does not take the resumed sandbox back.
	t0 = time.Now()
	li, paused, neverPaused := c.twoOnOneNode(t, ids[1:]) // ids[0] the scenario paused and resumed
	lostName := c.names[li]
	if code, b, _ := c.call(t, "POST", "/sandboxes/"+paused+"/pause", ""); code != http.StatusNoContent {
		t.Fatalf("pause %s through the gateway: %d %s", paused, code, b)
	}
	c.waitUploaded(t, paused)
	t.Logf("pause and upload of %s took %v", paused, time.Since(t0).Round(time.Millisecond))
	lost := c.nodes[li]
	if err := lost.Stop(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	c.waitNodes(t, 2)
	t0 = time.Now()
	runScenario(t, c, 0, "", "AENV_RESUME=[\""+paused+"\"]")
	t.Logf("resume of %s on another node took %v", paused, time.Since(t0).Round(time.Millisecond))
	if got := c.where(t, lostName)[paused]; got == "" || got == lostName {
		t.Fatalf("%s resumed on %q, want a live node", paused, got)
	}
	code, b, _ := c.call(t, "POST", "/sandboxes/"+neverPaused+"/connect", `{"timeout":60}`)
	if code != http.StatusNotFound || !strings.Contains(string(b), "repository") {
		t.Fatalf("connect of %s, never paused, on the dead node: %d %s; want a 404 naming the repository", neverPaused, code, b)
	}
	var whileDown []string
	for range 2 {
		whileDown = append(whileDown, c.create(t))
	}
	rctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// The revived node crashes as it removes its stale copy (its "killing"
	// durable, nothing removed yet); the next start finishes the removal.
	c.crashDroppingCopy(rctx, t, lost)
	if err := lost.Restart(rctx, 3*time.Minute); err != nil {
		t.Fatal(err)
	}
	c.checkDropped(t, li, paused) // the revived node's first answers know its copy is stale
	c.waitNodes(t, 3)
	where = c.where(t)
	for _, id := range whileDown {
		if where[id] == lostName {
			t.Fatalf("create %s landed on %s while it was down", id, lostName)
		}
	}
	c.reachable(t, ids[0])
	c.waitFound(t, neverPaused) // the revived node's roster was reconciled
	c.reachable(t, paused)
	if st := c.state(t, paused); st != "running" {
		t.Fatalf("%s after its old node came back: %q through the gateway, want running (bound where it resumed)", paused, st)
	}
	fresh := whileDown

	// A drained node gets no new creates.
	drained := c.names[1]
	if out := c.aenv(t, "node", "drain", drained); !strings.Contains(out, "draining true") {
		t.Fatalf("aenv node drain %s: %s", drained, out)
	}
	var nodes []struct {
		NodeID  string `json:"nodeID"`
		Status  string `json:"status"`
		Cluster struct {
			State    string `json:"state"`
			Draining bool   `json:"draining"`
		} `json:"cluster"`
	}
	if err := json.Unmarshal([]byte(c.aenv(t, "nodes", "-o", "json")), &nodes); err != nil || len(nodes) != 3 {
		t.Fatalf("aenv nodes through the gateway: %v %v", nodes, err)
	}
	for _, n := range nodes {
		if n.Cluster.State != "up" || n.Cluster.Draining != (n.NodeID == drained) || (n.Status == "draining") != (n.NodeID == drained) {
			t.Fatalf("aenv nodes: %+v (drained %s)", nodes, drained)
		}
	}
	var drainedPhase []string
	for range 3 {
		drainedPhase = append(drainedPhase, c.create(t))
	}
	where = c.where(t)
	for _, id := range drainedPhase {
		if where[id] == drained {
			t.Fatalf("create %s landed on drained %s", id, drained)
		}
		c.reachable(t, id)
	}
	// Killed through the gateway, a sandbox is gone from its node and from
	// the scheduler.
	for _, id := range append(append(append(ids, after), fresh...), drainedPhase...) {
		if code, b, _ := c.call(t, "DELETE", "/sandboxes/"+id, ""); code != 204 {
			t.Fatalf("kill %s through the gateway: %d %s", id, code, b)
		}
	}
	if code, _, _ := c.call(t, "GET", "/sandboxes/"+ids[0], ""); code != 404 {
		t.Fatalf("a killed sandbox through the gateway: %d, want 404", code)
	}
}
