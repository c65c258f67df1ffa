package api

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/api/wire"
)

// TestResizeSandboxMemoryErrors: the memory routes need the API key, a
// body with memoryMB (an integer), a size of at least 128 MiB (400 checked
// before the sandbox is looked up); an unknown sandbox is 404.
func TestResizeSandboxMemoryErrors(t *testing.T) {
	h := NewHandler(testOptions(t))
	for _, c := range []struct {
		method, path, key, body string
		status                  int
		says                    string
	}{
		{"PATCH", "/sandboxes/abc/memory", "", `{"memoryMB":256}`, http.StatusUnauthorized, "X-API-Key"},
		{"GET", "/sandboxes/abc/memory", "", "", http.StatusUnauthorized, "X-API-Key"},
		{"PATCH", "/sandboxes/abc/memory", testKey, ``, http.StatusBadRequest, "body is required"},
		{"PATCH", "/sandboxes/abc/memory", testKey, `{}`, http.StatusBadRequest, "memoryMB is required"},
		{"PATCH", "/sandboxes/abc/memory", testKey, `{"memoryMB":"256"}`, http.StatusBadRequest, "invalid JSON"},
		{"PATCH", "/sandboxes/abc/memory", testKey, `{"memoryMB":127}`, http.StatusBadRequest, "below the minimum of 128 MiB"},
		{"PATCH", "/sandboxes/abc/memory", testKey, `{"memoryMB":-1}`, http.StatusBadRequest, "below the minimum"},
		{"PATCH", "/sandboxes/abc/memory", testKey, `{"memoryMB":256}`, http.StatusNotFound, "abc"},
		{"GET", "/sandboxes/abc/memory", testKey, "", http.StatusNotFound, "abc"},
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
