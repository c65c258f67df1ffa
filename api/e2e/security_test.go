package e2e

import (
	"encoding/json"
	"net/http"
	"testing"
)

// TestAgentTokenAlways: a sandbox created without "secure" still has an
// agent that refuses requests without its token (only the proxy holds and
// presents it, and the API never shows it), so a connection that got past
// the node's network rules, even from inside the guest, gets nothing.
func TestAgentTokenAlways(t *testing.T) {
	n := sharedNode(t)
	id := n.create(t, `{"templateID":"base","timeout":120}`)
	var d struct {
		EnvdAccessToken *string `json:"envdAccessToken"`
	}
	if err := json.Unmarshal(n.expect(t, http.StatusOK, "GET", "/sandboxes/"+id, n.key, ""), &d); err != nil {
		t.Fatal(err)
	}
	if d.EnvdAccessToken != nil {
		t.Fatalf("a non-secure sandbox's details show an agent token")
	}
	// Through the proxy the agent works (the proxy presents the token) ...
	if got := n.sh(t, id, `echo through-the-proxy`); got != "through-the-proxy" {
		t.Fatalf("command through the proxy: %q", got)
	}
	// ... but a request that reaches the agent directly carries none.
	code := n.sh(t, id, `curl -s -o /dev/null -w '%{http_code}' -X POST -H 'Content-Type: application/json' -d '{}' http://127.0.0.1:49983/process.Process/List`)
	if code != "401" {
		t.Fatalf("the agent answered %s to a request without its token, want 401", code)
	}
}
