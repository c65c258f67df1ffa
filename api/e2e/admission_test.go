package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/aenvdtest"
)

// TestAdmissionLimits runs an aenvd of its own with [admission]
// max_sandboxes = 1 and max_fork_children = 1 (set through the
// configuration's environment): one sandbox runs; a second create is
// refused with 429, a Retry-After and a message naming the limit; a fork
// of two children is refused the same way before any child starts; once
// the first sandbox is killed a create is admitted again.
func TestAdmissionLimits(t *testing.T) {
	nodePrereqs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	n := ownNode(ctx, t, aenvdtest.Options{Prefix: "adadmit", CIDRBase: 97, Env: []string{
		"AENVD_ADMISSION_MAX_SANDBOXES=1", "AENVD_ADMISSION_MAX_FORK_CHILDREN=1"}})
	const body = `{"templateID":"base","timeout":300}`
	first := n.create(t, body)

	n.expectRefused(t, "POST", "/sandboxes", body, "max_sandboxes")
	n.expectRefused(t, "POST", "/sandboxes/"+first+"/fork", `{"count":2}`, "max_fork_children")
	if got := n.sandboxCount(t); got != 1 {
		t.Fatalf("after two refusals the node lists %d sandboxes, want 1", got)
	}

	n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+first, n.key, "")
	second := n.create(t, body)
	if got := n.sh(t, second, "echo admitted"); got != "admitted" {
		t.Fatalf("the sandbox admitted after the kill runs no command: %q", got)
	}
	n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+second, n.key, "")
}

// expectRefused asserts that a call is refused by admission: 429, a
// Retry-After of whole seconds, and a message naming the limit's key.
func (n *node) expectRefused(t *testing.T, method, path, body, limit string) {
	t.Helper()
	code, b, h := n.call(t, method, path, n.key, body)
	if code != http.StatusTooManyRequests {
		t.Fatalf("%s %s over %s: status %d, want 429; body %s", method, path, limit, code, b)
	}
	if got := checkRefusal(t, code, b, h); got != limit {
		t.Fatalf("%s %s over %s: refused by %s", method, path, limit, got)
	}
}

// sandboxCount is how many sandboxes GET /sandboxes lists.
func (n *node) sandboxCount(t *testing.T) int {
	t.Helper()
	var list []json.RawMessage
	if err := json.Unmarshal(n.expect(t, http.StatusOK, "GET", "/sandboxes", n.key, ""), &list); err != nil {
		t.Fatalf("list sandboxes: %v", err)
	}
	return len(list)
}

// TestCreateUntilRefused: a node with the default [admission] limits takes
// creates until it refuses one, each sandbox filling 100 MiB of its guest
// memory as it arrives (tmpfs, so the host commits real pages), and the
// host neither swaps nor OOM-kills anything on the way: the kernel's
// oom_kill and pswpout counters are unchanged, every sandbox still answers,
// and the refusal is 429 or 503 with a Retry-After and a message naming
// its limit. The node's default limits are what a single box must survive.
func TestCreateUntilRefused(t *testing.T) {
	nodePrereqs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	n := ownNode(ctx, t, aenvdtest.Options{Prefix: "adfill", CIDRBase: 99})
	before := vmstat(t)
	const body = `{"templateID":"base","timeout":1800}`
	const maxTries = 200 // far above any default limit: the loop ends
	var ids []string
	var refusal string
	for len(ids) < maxTries && refusal == "" {
		code, b, h := n.call(t, "POST", "/sandboxes", n.key, body)
		switch code {
		case http.StatusCreated:
			var sbx sandboxJSON
			if err := json.Unmarshal(b, &sbx); err != nil || sbx.SandboxID == "" {
				t.Fatalf("create %d: %s %v", len(ids)+1, b, err)
			}
			ids = append(ids, sbx.SandboxID)
			id := sbx.SandboxID
			t.Cleanup(func() { n.call(t, "DELETE", "/sandboxes/"+id, n.key, "") })
			// 100 MiB of the guest's 256 (its /dev/shm holds half its memory), written: real host pages.
			n.sh(t, id, "head -c 100M /dev/zero > /dev/shm/fill")
		case http.StatusTooManyRequests, http.StatusServiceUnavailable:
			refusal = checkRefusal(t, code, b, h)
		default:
			t.Fatalf("create %d: status %d: %s", len(ids)+1, code, b)
		}
	}
	if refusal == "" {
		t.Fatalf("%d creates admitted and none refused", len(ids))
	}
	t.Logf("%d sandboxes admitted, then refused by %s", len(ids), refusal)
	after := vmstat(t)
	for _, k := range []string{"oom_kill", "pswpout"} {
		if after[k] != before[k] {
			t.Errorf("/proc/vmstat %s went from %d to %d while the node filled up", k, before[k], after[k])
		}
	}
	for i, id := range ids {
		if got := n.sh(t, id, "echo alive; wc -c < /dev/shm/fill"); got != "alive\n104857600" {
			t.Errorf("sandbox %d (%s) after the node filled up: %q", i+1, id, got)
		}
	}
}

// checkRefusal asserts an admission refusal's Retry-After and message and
// returns the limit it names.
func checkRefusal(t *testing.T, code int, b []byte, h http.Header) string {
	t.Helper()
	if s, err := strconv.Atoi(h.Get("Retry-After")); err != nil || s <= 0 {
		t.Fatalf("refusal %d without a Retry-After of whole seconds: %q", code, h.Get("Retry-After"))
	}
	var e struct {
		Message string `json:"message"`
	}
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("refusal %d body %s: %v", code, b, err)
	}
	for _, limit := range []string{"max_sandboxes", "max_committed_mib", "disk_reserve_mib", "max_fork_children"} {
		if strings.Contains(e.Message, limit) {
			return limit
		}
	}
	t.Fatalf("refusal %d names no admission limit: %s", code, b)
	return ""
}

// vmstat reads the counters of /proc/vmstat.
func vmstat(t *testing.T) map[string]int64 {
	t.Helper()
	raw, err := os.ReadFile("/proc/vmstat")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, line := range strings.Split(string(raw), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			out[k] = n
		}
	}
	if _, ok := out["oom_kill"]; !ok {
		t.Fatal("/proc/vmstat has no oom_kill counter")
	}
	return out
}
