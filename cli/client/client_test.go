package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// fakeAPI answers the documented routes the real aenvd does not have yet and
// pages GET /v2/sandboxes one sandbox at a time.
func fakeAPI(t *testing.T) *Client {
	t.Helper()
	mux := http.NewServeMux()
	check := func(w http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("X-API-Key") != "k" {
			w.WriteHeader(401)
			fmt.Fprint(w, `{"code":401,"message":"invalid or missing X-API-Key"}`)
			return false
		}
		return true
	}
	mux.HandleFunc("GET /v2/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		if !check(w, r) {
			return
		}
		if got := r.URL.Query().Get("metadata"); got != "a=1" || r.URL.Query().Get("state") != "running,paused" {
			t.Errorf("list query %q", r.URL.RawQuery)
		}
		ids := []string{"s1", "s2", "s3"}
		i := 0
		if tok := r.URL.Query().Get("nextToken"); tok != "" {
			fmt.Sscan(strings.TrimPrefix(tok, "t"), &i)
		}
		if i+1 < len(ids) {
			w.Header().Set("X-Next-Token", fmt.Sprintf("t%d", i+1))
		}
		fmt.Fprintf(w, `[{"sandboxID":%q,"state":"running"}]`, ids[i])
	})
	mux.HandleFunc("POST /sandboxes/{id}/fork", func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Count, Timeout int }
		_ = json.NewDecoder(r.Body).Decode(&req)
		if r.PathValue("id") != "p" || req.Count != 2 || req.Timeout != 60 {
			t.Errorf("fork request %s %+v", r.PathValue("id"), req)
		}
		w.WriteHeader(201)
		fmt.Fprint(w, `[{"sandbox":{"sandboxID":"c1","templateID":"base"}},{"error":{"code":507,"message":"no capacity"}}]`)
	})
	mux.HandleFunc("POST /sandboxes/{id}/snapshots", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(201)
		fmt.Fprint(w, `{"snapshotID":"snap1","names":["mine"]}`)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(404)
		if strings.HasPrefix(r.URL.Path, "/sandboxes/gone") {
			fmt.Fprint(w, `{"code":404,"message":"sandbox gone not found"}`)
			return
		}
		fmt.Fprintf(w, `{"code":404,"message":"no route %s"}`, r.URL.Path) // aenvd's router
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return New(srv.URL+"/", "k")
}

func TestListAllPages(t *testing.T) {
	c := fakeAPI(t)
	l, err := c.List(context.Background(), ListOptions{States: []string{"running", "paused"}, Metadata: map[string]string{"a": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(l) != 3 || l[0].SandboxID != "s1" || l[2].SandboxID != "s3" {
		t.Fatalf("List over 3 pages: %+v", l)
	}
}

func TestForkAndSnapshot(t *testing.T) {
	c := fakeAPI(t)
	res, err := c.Fork(context.Background(), "p", 2, 60)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2 || res[0].Sandbox == nil || res[0].Sandbox.SandboxID != "c1" || res[1].Error == nil || res[1].Error.Code != 507 {
		t.Fatalf("fork results %+v", res)
	}
	s, err := c.CreateSnapshot(context.Background(), "p", "mine")
	if err != nil || s.SnapshotID != "snap1" || len(s.Names) != 1 {
		t.Fatalf("snapshot %+v %v", s, err)
	}
}

func TestErrors(t *testing.T) {
	c := fakeAPI(t)
	ctx := context.Background()
	// A route the server lacks is ErrUnsupported, not "sandbox not found".
	_, err := c.ListSnapshots(ctx, "")
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "list snapshots") {
		t.Fatalf("missing route: %v", err)
	}
	if err := c.DeleteTemplate(ctx, "x"); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("missing route: %v", err)
	}
	// An unknown sandbox is a 404 with a hint.
	err = c.Kill(ctx, "gone")
	if !NotFound(err) || errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "remove sandbox gone") || !strings.Contains(err.Error(), "aenv list") {
		t.Fatalf("unknown sandbox: %v", err)
	}
	// A bad key says so.
	c.APIKey = "bad"
	if _, err := c.List(ctx, ListOptions{}); err == nil || !strings.Contains(err.Error(), "401") || !strings.Contains(err.Error(), "aenv auth") {
		t.Fatalf("bad key: %v", err)
	}
	// An unreachable server names the URL and what to check.
	c = New("http://127.0.0.1:1", "k")
	if err := c.Pause(ctx, "x", true); err == nil || !strings.Contains(err.Error(), "cannot reach aenvd at http://127.0.0.1:1") {
		t.Fatalf("unreachable: %v", err)
	}
}
