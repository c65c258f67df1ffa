package proxy

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestRoute(t *testing.T) {
	p := &Proxy{domain: "sbx.example.com"}
	cases := []struct {
		name    string
		host    string
		headers map[string]string
		match   bool
		id      string
		port    int
	}{
		{"headers", "127.0.0.1:3001", map[string]string{HeaderSandboxID: "abc123", HeaderSandboxPort: "49983"}, true, "abc123", 49983},
		{"header id, bad port", "x", map[string]string{HeaderSandboxID: "abc123", HeaderSandboxPort: "http"}, true, "abc123", 0},
		{"header id, port out of range", "x", map[string]string{HeaderSandboxID: "abc123", HeaderSandboxPort: "70000"}, true, "abc123", 0},
		{"host", "8080-abc123.sbx.example.com", nil, true, "abc123", 8080},
		{"host with port", "49983-abc123.sbx.example.com:443", nil, true, "abc123", 49983},
		{"host of another domain", "8080-abc123.other.com", nil, false, "", 0},
		{"host without port label", "abc123.sbx.example.com", nil, false, "", 0},
		{"host with a dotted id", "80-a.b.sbx.example.com", nil, false, "", 0},
		{"the bare domain", "sbx.example.com", nil, false, "", 0},
		{"api request", "127.0.0.1:3000", nil, false, "", 0},
	}
	for _, c := range cases {
		r := httptest.NewRequest(http.MethodGet, "/x", nil)
		r.Host = c.host
		for k, v := range c.headers {
			r.Header.Set(k, v)
		}
		got, ok := p.route(r)
		if ok != c.match || got.id != c.id || got.port != c.port {
			t.Errorf("%s: route = %+v, %v; want id %q port %d match %v", c.name, got, ok, c.id, c.port, c.match)
		}
	}
	p.domain = ""
	r := httptest.NewRequest(http.MethodGet, "/x", nil)
	r.Host = "8080-abc123.sbx.example.com"
	if _, ok := p.route(r); ok {
		t.Error("host routing without a domain matched")
	}
}
