package api

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/api/wire"
)

// TestPinSandboxCPUsErrors: the pin routes need the API key, a body with
// pin, a list that parses (400 naming the bad part, checked before the
// sandbox is looked up) and CPUs the node has; an unknown sandbox is 404.
func TestPinSandboxCPUsErrors(t *testing.T) {
	h := NewHandler(testOptions(t))
	for _, c := range []struct {
		method, path, key, body string
		status                  int
		says                    string
	}{
		{"PUT", "/sandboxes/abc/cpus", "", `{"pin":"0"}`, http.StatusUnauthorized, "X-API-Key"},
		{"GET", "/sandboxes/abc/cpus", "", "", http.StatusUnauthorized, "X-API-Key"},
		{"PUT", "/sandboxes/abc/cpus", testKey, ``, http.StatusBadRequest, "body is required"},
		{"PUT", "/sandboxes/abc/cpus", testKey, `{}`, http.StatusBadRequest, "pin is required"},
		{"PUT", "/sandboxes/abc/cpus", testKey, `{"pin":1}`, http.StatusBadRequest, "invalid JSON"},
		{"PUT", "/sandboxes/abc/cpus", testKey, `{"pin":"0-x"}`, http.StatusBadRequest, `part "0-x"`},
		{"PUT", "/sandboxes/abc/cpus", testKey, `{"pin":"0,0"}`, http.StatusBadRequest, `part "0"`},
		{"PUT", "/sandboxes/abc/cpus", testKey, `{"pin":"3-1"}`, http.StatusBadRequest, "descends"},
		{"PUT", "/sandboxes/abc/cpus", testKey, `{"pin":"0,1023"}`, http.StatusBadRequest, `part "1023": cpu 1023 is not available`},
		{"PUT", "/sandboxes/abc/cpus", testKey, `{"pin":"0"}`, http.StatusNotFound, "abc"},
		{"PUT", "/sandboxes/abc/cpus", testKey, `{"pin":""}`, http.StatusNotFound, "abc"},
		{"GET", "/sandboxes/abc/cpus", testKey, "", http.StatusNotFound, "abc"},
	} {
		w := do(h, c.method, c.path, c.key, c.body)
		checkError(t, w)
		var e wire.Error
		_ = json.Unmarshal(w.Body.Bytes(), &e)
		if w.Code != c.status || !strings.Contains(e.Message, c.says) {
			t.Errorf("%s %s %s: %d %s, want %d saying %q", c.method, c.path, c.body, w.Code, w.Body, c.status, c.says)
		}
	}
}
