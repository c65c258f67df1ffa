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
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/aenvdtest"
)

// poolHigh is the pool node's watermark: the base template keeps this many
// VMMs waiting (low is the same, so every take starts a refill).
const poolHigh = 2

var (
	pooled     *node
	pooledErr  error
	pooledOnce sync.Once
)

// poolNode starts, once per test binary, a second aenvd with the warm pool
// of VMM processes on for the base template. Paused memory stays layered
// there (no background flatten), so that resumes map the template's memory
// file and take pool entries as surely as creates do.
func poolNode(t *testing.T) *node {
	t.Helper()
	nodePrereqs(t)
	pooledOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		env := []string{fmt.Sprintf("AENVD_VMM_POOL_LOW=%d", poolHigh), fmt.Sprintf("AENVD_VMM_POOL_HIGH=%d", poolHigh),
			"AENVD_VMM_POOL_TEMPLATES=base", "AENVD_SANDBOX_FLATTEN_PAUSED=false",
			// A pooled VMM maps the template's memory file and a resume
			// onto it writes the pause's layers in: VMs map flattened
			// files, not the storage daemon's exports (with those a
			// resume restores a VMM of its own and writes nothing in).
			"AENVD_STORAGE_SHARED_MEMORY=none"}
		var n *aenvdtest.Node
		if n, pooledErr = aenvdtest.Start(ctx, aenvdtest.Options{Prefix: "adpool", CIDRBase: 89, Env: env}); pooledErr == nil {
			pooled = &node{Node: n, api: n.API, proxy: n.Proxy, key: n.Key}
		}
	})
	if pooledErr != nil {
		t.Fatalf("start aenvd with a warm pool: %v", pooledErr)
	}
	return pooled
}

// vmmPoolJSON is /nodes' report of the warm pool.
type vmmPoolJSON struct {
	Ready    int   `json:"ready"`
	Starting int   `json:"starting"`
	High     int   `json:"high"`
	Hits     int64 `json:"hits"`
	Misses   int64 `json:"misses"`
}

// poolStats returns the node's warm pool as /nodes reports it (nil: off).
func (n *node) poolStats(t *testing.T) *vmmPoolJSON {
	t.Helper()
	var nodes []struct {
		VMMPool *vmmPoolJSON `json:"vmmPool"`
	}
	if err := json.Unmarshal(n.expect(t, http.StatusOK, "GET", "/nodes", n.key, ""), &nodes); err != nil || len(nodes) != 1 {
		t.Fatalf("/nodes: %v", err)
	}
	return nodes[0].VMMPool
}

// waitPoolFull waits until the pool holds its high watermark of ready
// entries and fills none (nil when the node has no pool).
func (n *node) waitPoolFull(t *testing.T) *vmmPoolJSON {
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		st := n.poolStats(t)
		if st == nil || st.Ready == st.High && st.Starting == 0 {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("the warm pool did not fill: %+v\n%s", st, tailString(n.Logs(), 4000))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// poolEntries lists the pool's entry directories (<data dir>/pool/<id>).
func (n *node) poolEntries(t *testing.T) []string {
	t.Helper()
	return n.dataDirNames(t, "pool")
}

// TestVMMPool: with the warm pool on, a create through E2B's SDK takes a
// waiting VMM (the pool's hit count moves, the sandbox's VMM is one of the
// entries that waited), runs commands with its own env vars and
// round-trips files; the pool refills to its watermark, and nothing is
// left that neither a sandbox nor the pool owns, also after a kill -9 of
// aenvd with the pool full.
func TestVMMPool(t *testing.T) {
	n := poolNode(t)
	before := n.waitPoolFull(t)
	waiting := n.pooledVMMs(t)
	if len(waiting) != poolHigh {
		t.Fatalf("%d VMM processes wait in the pool, want %d", len(waiting), poolHigh)
	}
	for pid := range waiting {
		checkPooledConfined(t, pid)
	}
	v := sdkVersions[len(sdkVersions)-1]
	out, err := runSDKScript(t, n, v, "pool.mjs", 4*time.Minute)
	if err != nil {
		t.Fatalf("E2B SDK %s against the pool: %v\n%s\n%s", v.version, err, out, tailString(n.Logs(), 4000))
	}
	id := ""
	for _, l := range strings.Split(out, "\n") {
		if s, ok := strings.CutPrefix(l, "sandbox "); ok {
			id = s
		}
	}
	after := n.waitPoolFull(t)
	if after.Hits != before.Hits+1 || after.Misses != before.Misses {
		t.Fatalf("the create did not take a pool entry: before %+v, after %+v\n%s", before, after, out)
	}
	// The sandbox's VMM was one of the waiting ones (its log names the pid).
	if !n.loggedPooledPID(id, waiting) {
		t.Fatalf("sandbox %s's VMM is none of the pool's %v\n%s", id, waiting, n.diagnose(id))
	}
	n.checkNoOrphans(t)

	// kill -9 with a full pool: the next start removes the waiting VMMs
	// (and their devices and slots) and fills the pool anew.
	refilled := n.pooledVMMs(t)
	n.restart(t, syscall.SIGKILL)
	n.waitPoolFull(t)
	for pid := range refilled {
		if _, err := os.Stat("/proc/" + pid); err == nil {
			if st, _ := os.ReadFile("/proc/" + pid + "/stat"); !strings.Contains(string(st), ") Z ") {
				t.Errorf("pooled VMM %s of the killed aenvd still runs after the restart", pid)
			}
		}
	}
	n.checkNoOrphans(t)
}

// pooledVMMs are the VMM processes waiting in the pool, by pid.
func (n *node) pooledVMMs(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, e := range n.poolEntries(t) {
		for _, pid := range processesMentioning(filepath.Join(n.DataDir, "pool", e) + "/") {
			out[pid] = true
		}
	}
	return out
}

// loggedPooledPID reports whether aenvd logged sandbox id's VM with one of
// the pids.
func (n *node) loggedPooledPID(id string, pids map[string]bool) bool {
	for _, l := range strings.Split(n.Logs(), "\n") {
		if !strings.Contains(l, "sandbox="+id) || !strings.Contains(l, "pid=") {
			continue
		}
		for pid := range pids {
			if strings.Contains(l, " pid="+pid+" ") || strings.HasSuffix(l, " pid="+pid) {
				return true
			}
		}
	}
	return false
}

// crashPooledCreate (the pool node): a create that takes a pool entry is
// crashed at point. The restart rolls it back (crashCreate's checks), the
// pool refills, and the next create is served from it and runs.
func (n *node) crashPooledCreate(t *testing.T, point string) {
	n.waitPoolFull(t)
	n.crashCreate(t, point)
	before := n.waitPoolFull(t)
	id := n.create(t, `{"templateID":"base","timeout":120}`)
	if got := n.sh(t, id, "echo pooled"); got != "pooled" {
		t.Fatalf("a create after the crash at %s: %q", point, got)
	}
	if after := n.poolStats(t); after.Hits != before.Hits+1 {
		t.Fatalf("the create after the crash at %s did not take a pool entry: %+v then %+v", point, before, after)
	}
	n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, n.key, "")
}

// crashPooledResume (the pool node): a resume that takes a pool entry is
// crashed at point, before its "running" record. The restart puts the
// sandbox back to paused without adopting the pooled VMM (which may never
// have loaded the sandbox's state); it then resumes with its files and the
// marker it kept in memory.
func (n *node) crashPooledResume(t *testing.T, point string) {
	id := n.create(t, `{"templateID":"base","timeout":300}`)
	data := n.writeData(t, id, "pr")
	n.sh(t, id, `echo kept in memory > /dev/shm/marker`)
	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, "")
	n.waitPoolFull(t)
	n.crashAt(t, point, func() { _, _, _, _ = n.Call("POST", "/sandboxes/"+id+"/connect", n.key, `{"timeout":60}`) })
	if st := n.listed(t)[id]; st != "paused" {
		t.Fatalf("sandbox %s is %q after a crash at %s during its pooled resume, want paused\n%s", id, st, point, n.diagnose(id))
	}
	n.resumeAndCheck(t, id, data)
	if got := n.sh(t, id, `cat /dev/shm/marker`); got != "kept in memory" {
		t.Fatalf("sandbox %s after a crash at %s: its memory marker reads %q", id, point, got)
	}
	n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, n.key, "")
}

// crashPoolFill (the pool node): the refill a create's take starts is
// crashed at point. The create may have answered before the crash (then its
// sandbox runs on after the restart) or not (then it is gone); the restart
// removes every entry and the pool fills again.
func (n *node) crashPoolFill(t *testing.T, point string) {
	n.waitPoolFull(t)
	before := n.listed(t)
	removedLine := "removed a warm pool entry a previous process left"
	removed := strings.Count(n.Logs(), removedLine)
	var id string
	var err error
	n.crashAt(t, point, func() { id, err = n.Create(`{"templateID":"base","timeout":120}`) })
	// The entry being filled was recorded: the restart removed it (and the
	// ready ones) by their records.
	if got := strings.Count(n.Logs(), removedLine); got <= removed+poolHigh-1 {
		t.Fatalf("the restart after the crash at %s removed %d pool entries by their records, want %d or more", point, got-removed, poolHigh)
	}
	after := n.listed(t)
	if err == nil {
		if after[id] != "running" {
			t.Fatalf("sandbox %s, created before the crash at %s, is %q after it", id, point, after[id])
		}
		if got := n.sh(t, id, "echo kept"); got != "kept" {
			t.Fatalf("sandbox %s after the crash at %s: %q", id, point, got)
		}
		n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, n.key, "")
		return
	}
	// No answer does not mean no sandbox: the refill waits for the create
	// it refills after, so the crash can come after the create's "running"
	// record (its commit point) and take only its answer. Such a sandbox
	// is whole; anything else new is a create left half-made.
	committed := 0
	for sid, st := range after {
		if _, ok := before[sid]; ok {
			continue
		}
		if committed++; st != "running" || committed > 1 {
			t.Fatalf("a create cut off by the crash at %s left sandbox %s (%s)", point, sid, st)
		}
		if got := n.sh(t, sid, "echo kept"); got != "kept" {
			t.Fatalf("sandbox %s, committed before the crash at %s took its answer: %q", sid, point, got)
		}
		n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+sid, n.key, "")
	}
}

// checkPooledConfined: a VMM waiting in the pool is confined like any
// other: its seccomp filter, an unprivileged identity of its own, and a
// control group of its own (the entry's).
func checkPooledConfined(t *testing.T, pid string) {
	t.Helper()
	status, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		t.Fatal(err)
	}
	uid := ""
	for _, l := range strings.Split(string(status), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "Uid:" {
			uid = f[1]
		}
	}
	if !strings.Contains(string(status), "\nSeccomp:\t2\n") || uid == "" || uid == "0" {
		t.Errorf("pooled VMM %s: uid %q, status\n%s", pid, uid, status)
	}
	cg, err := os.ReadFile("/proc/" + pid + "/cgroup")
	if err != nil || !strings.Contains(string(cg), "/vm-") {
		t.Errorf("pooled VMM %s is in no control group of its entry: %s %v", pid, cg, err)
	}
}
