package proxy

import (
	"net/http"
	"net/http/httptest"
	"strings"
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

// FuzzRoute: the routing parser takes any host and headers without
// panicking, and what it routes names a plausible sandbox and port.
func FuzzRoute(f *testing.F) {
	f.Add("8080-abc123.sbx.example.com", "", "")
	f.Add("49983-abc123.sbx.example.com:443", "", "")
	f.Add("x", "abc123", "49983")
	f.Add("80-a.b.sbx.example.com", "", "")
	f.Add("-.sbx.example.com", "a.b:c", "-1")
	f.Add("99999999999999999999-x.sbx.example.com", "", "")
	p := &Proxy{domain: "sbx.example.com"}
	f.Fuzz(func(t *testing.T, host, id, port string) {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.Host = host
		r.Header.Set(HeaderSandboxID, id)
		r.Header.Set(HeaderSandboxPort, port)
		got, ok := p.route(r)
		if !ok {
			return
		}
		if got.port < 0 || got.port > 65535 {
			t.Fatalf("route(%q, %q, %q) gave port %d", host, id, port, got.port)
		}
		if r.Header.Get(HeaderSandboxID) == "" && (!validID(got.id) || got.port == 0) {
			t.Fatalf("host route(%q) gave %+v", host, got)
		}
		if validID(got.id) && strings.ContainsAny(got.id, ".:/[]@") {
			t.Fatalf("id %q could address an upstream", got.id)
		}
	})
}

// FuzzStripControlPlane: whatever the client sends, no header that leaves
// for the guest still carries the API key.
func FuzzStripControlPlane(f *testing.F) {
	const key = "e2b_fuzzkey"
	f.Add("Bearer e2b_fuzzkey", "a=1; s=e2b_fuzzkey", "e2b_fuzzkey")
	f.Add("Basic ZTJiX2Z1enprZXk6", "e2b_fuzzkey", "")
	f.Add("Basic dXNlcjo=", "theme=dark", "x")
	p := &Proxy{APIKey: key}
	f.Fuzz(func(t *testing.T, auth, cookie, apiKey string) {
		h := http.Header{}
		h.Set("Authorization", auth)
		h.Set("Cookie", cookie)
		h.Set("X-API-Key", apiKey)
		h.Set("X-Access-Token", apiKey)
		p.stripControlPlane(h, 8080)
		for k, vs := range h {
			for _, v := range vs {
				if carriesKey(v, key) {
					t.Fatalf("%s: %q still carries the key", k, v)
				}
			}
		}
	})
}
