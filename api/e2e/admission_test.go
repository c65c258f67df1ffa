package e2e

import (
	"context"
	"encoding/json"
	"net/http"
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
	an, err := aenvdtest.Start(ctx, aenvdtest.Options{Prefix: "adadmit", CIDRBase: 97, Env: []string{
		"AENVD_ADMISSION_MAX_SANDBOXES=1", "AENVD_ADMISSION_MAX_FORK_CHILDREN=1"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // after the sandboxes' own cleanups
		if err := an.Close(); err != nil {
			t.Errorf("graceful shutdown: %v", err)
		}
	})
	n := &node{Node: an, api: an.API, proxy: an.Proxy, key: an.Key}
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
	if s, err := strconv.Atoi(h.Get("Retry-After")); err != nil || s <= 0 {
		t.Fatalf("%s %s over %s: Retry-After %q, want whole seconds > 0", method, path, limit, h.Get("Retry-After"))
	}
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(b, &e); err != nil || e.Code != http.StatusTooManyRequests || !strings.Contains(e.Message, limit) {
		t.Fatalf("%s %s over %s: error body %s does not name the limit (%v)", method, path, limit, b, err)
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
