package e2e

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// TestAPINegative checks auth, validation and lifecycle conflicts with one
// real sandbox: create, pause, pause again (409), kill, kill again (404).
func TestAPINegative(t *testing.T) {
	n := sharedNode(t)
	n.expect(t, http.StatusNoContent, "GET", "/health", "", "")
	n.expect(t, http.StatusUnauthorized, "GET", "/sandboxes", "", "")
	n.expect(t, http.StatusUnauthorized, "GET", "/v2/sandboxes", "e2b_wrong", "")
	n.expect(t, http.StatusUnauthorized, "POST", "/sandboxes", "", `{"templateID":"base"}`)
	n.expect(t, http.StatusBadRequest, "POST", "/sandboxes", n.key, `{"templateID": "base"`)
	n.expect(t, http.StatusBadRequest, "POST", "/v2/sandboxes", n.key, `[1,2,3]`)
	n.expect(t, http.StatusBadRequest, "POST", "/sandboxes", n.key, ``)
	n.expect(t, http.StatusBadRequest, "POST", "/sandboxes", n.key, `{"templateID":"base","timeout":-5}`)
	n.expect(t, http.StatusBadRequest, "POST", "/sandboxes", n.key, `{"templateID":"base","timeout":"soon"}`)
	n.expect(t, http.StatusBadRequest, "GET", "/v2/sandboxes?limit=0", n.key, "")
	n.expect(t, http.StatusBadRequest, "GET", "/v2/sandboxes?limit=abc", n.key, "")
	n.expect(t, http.StatusBadRequest, "GET", "/v2/sandboxes?state=sleeping", n.key, "")
	n.expect(t, http.StatusBadRequest, "GET", "/v2/sandboxes?nextToken=%25%25", n.key, "")
	n.expect(t, http.StatusNotFound, "POST", "/sandboxes", n.key, `{"templateID":"no-such-template"}`)
	n.expect(t, http.StatusNotFound, "GET", "/templates/no-such-template", n.key, "")
	n.expect(t, http.StatusNotFound, "GET", "/sandboxes/nosuchsandbox", n.key, "")
	n.expect(t, http.StatusNotFound, "DELETE", "/sandboxes/nosuchsandbox", n.key, "")
	n.expect(t, http.StatusNotFound, "POST", "/sandboxes/nosuchsandbox/pause", n.key, "")

	var tpl struct {
		TemplateID  string `json:"templateID"`
		BuildStatus string `json:"buildStatus"`
	}
	if err := json.Unmarshal(n.expect(t, http.StatusOK, "GET", "/templates/base", n.key, ""), &tpl); err != nil || tpl.BuildStatus != "ready" {
		t.Fatalf("template base: %+v %v", tpl, err)
	}

	var sbx struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	body := n.expect(t, http.StatusCreated, "POST", "/v2/sandboxes", n.key, `{"templateID":"base","timeout":120}`)
	if err := json.Unmarshal(body, &sbx); err != nil || sbx.SandboxID == "" || sbx.EnvdAccessToken == "" {
		t.Fatalf("create (v2, always secured): %s %v", body, err)
	}
	id := sbx.SandboxID
	t.Cleanup(func() { n.call(t, "DELETE", "/sandboxes/"+id, n.key, "") })

	// The proxy: the agent answers through it; a secured agent refuses a request without the token.
	if code := n.proxyGet(t, id, "49983", "/health", ""); code != http.StatusNoContent {
		t.Fatalf("agent /health through the proxy: %d", code)
	}
	if code := n.proxyGet(t, id, "49983", "/envs", ""); code != http.StatusUnauthorized {
		t.Fatalf("agent /envs without the access token: %d, want 401", code)
	}
	if code := n.proxyGet(t, id, "49983", "/envs", sbx.EnvdAccessToken); code != http.StatusOK {
		t.Fatalf("agent /envs with the access token: %d", code)
	}
	if code := n.proxyGet(t, "nosuchsandbox", "49983", "/health", ""); code != http.StatusBadGateway {
		t.Fatalf("proxy to an unknown sandbox: %d, want 502", code)
	}
	if code := n.proxyGet(t, id, "notaport", "/health", ""); code != http.StatusBadRequest {
		t.Fatalf("proxy with a bad port: %d, want 400", code)
	}

	n.expect(t, http.StatusBadRequest, "POST", "/sandboxes/"+id+"/timeout", n.key, `{"timeout":`)
	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/timeout", n.key, `{"timeout":300}`)
	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, "")
	n.expect(t, http.StatusConflict, "POST", "/sandboxes/"+id+"/pause", n.key, "")
	if code := n.proxyGet(t, id, "49983", "/health", ""); code != http.StatusBadGateway {
		t.Fatalf("proxy to a paused sandbox: %d, want 502", code)
	}
	var detail struct {
		State string `json:"state"`
	}
	if err := json.Unmarshal(n.expect(t, http.StatusOK, "GET", "/sandboxes/"+id, n.key, ""), &detail); err != nil || detail.State != "paused" {
		t.Fatalf("detail after pause: %+v %v", detail, err)
	}
	n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, n.key, "")
	n.expect(t, http.StatusNotFound, "DELETE", "/sandboxes/"+id, n.key, "")
	n.expect(t, http.StatusNotFound, "POST", "/sandboxes/"+id+"/connect", n.key, "{}")

	// Hostile bodies never crash the server.
	for _, b := range []string{`{"templateID":null}`, `{"metadata":{"a":1}}`, strings.Repeat("[", 100000), `{"templateID":"base","envVars":"x"}`} {
		if code, _, _ := n.call(t, "POST", "/sandboxes", n.key, b); code != http.StatusBadRequest {
			t.Errorf("body %.40q: status %d, want 400", b, code)
		}
	}
	n.expect(t, http.StatusNoContent, "GET", "/health", "", "")
}

func (n *node) proxyGet(t *testing.T, id, port, path, token string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", n.proxy+path, nil)
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", port)
	if token != "" {
		req.Header.Set("X-Access-Token", token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("proxy GET %s: %v", path, err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
