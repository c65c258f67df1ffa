package proxy

import (
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/guest/agent/files"
)

// IDs makes the test registry a Lister.
func (s *sandboxes) IDs() []string {
	ids := make([]string, 0, len(s.recs))
	for id := range s.recs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func TestSignFilesIsTheAgents(t *testing.T) {
	exp := int64(1700000000)
	for _, e := range []*int64{nil, &exp} {
		if got, want := signFiles("/a b", "write", "user", "tok", e), files.Sign("/a b", "write", "user", "tok", e); got != want {
			t.Fatalf("signFiles = %s, the agent's Sign = %s", got, want)
		}
	}
}

func TestBySignature(t *testing.T) {
	s := &sandboxes{recs: map[string]record{
		"aaa": {Sandbox: Sandbox{AccessToken: "tok-a"}, running: true},
		"bbb": {Sandbox: Sandbox{AccessToken: "tok-b"}, running: true},
		"ccc": {Sandbox: Sandbox{AccessToken: "tok-c", Killing: true}},
	}}
	p := New(s, "", nil)
	req := func(method, path, op, token string) (target, bool) {
		q := url.Values{"path": {path}, "signature": {signFiles(path, op, "", token, nil)}}
		return p.bySignature(httptest.NewRequest(method, "/files?"+q.Encode(), nil))
	}
	if tg, ok := req("GET", "/f", "read", "tok-b"); !ok || tg != (target{id: "bbb", port: AgentPort}) {
		t.Fatalf("a read signed by bbb's token routes to %+v, %v", tg, ok)
	}
	if tg, ok := req("POST", "/f", "write", "tok-a"); !ok || tg.id != "aaa" {
		t.Fatalf("a write signed by aaa's token routes to %+v, %v", tg, ok)
	}
	if _, ok := req("POST", "/f", "read", "tok-a"); ok {
		t.Fatal("a read signature used for a write was routed")
	}
	if _, ok := req("GET", "/f", "read", "tok-c"); ok {
		t.Fatal("a killed sandbox's signature was routed")
	}
	if _, ok := req("GET", "/f", "read", "other"); ok {
		t.Fatal("a signature of no sandbox's token was routed")
	}
	w := httptest.NewRecorder()
	p.ServeHTTP(w, httptest.NewRequest("GET", "/files?path=/f", nil))
	if w.Code != 400 || !strings.Contains(w.Body.String(), "unsigned /files URL") {
		t.Fatalf("an unsigned /files URL naming no sandbox answered %d %s", w.Code, w.Body)
	}
}
