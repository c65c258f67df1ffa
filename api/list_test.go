package api

import (
	"encoding/json"
	"github.com/agentenv/agentenv/disk/disktest"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/template"

	"github.com/agentenv/agentenv/oci"
	"github.com/agentenv/agentenv/orchestrator"
	"github.com/agentenv/agentenv/store"
)

// listTestHandler serves the API over four paused sandboxes started a
// minute apart (s1 oldest), s1 and s3 from "base", s2 and s4 from the
// template "tplcode" named "code-interpreter"; it returns their start times.
func listTestHandler(t *testing.T) (http.Handler, map[string]time.Time) {
	t.Helper()
	dir := t.TempDir()
	st := testStore(t, dir)
	t0 := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	started := map[string]time.Time{}
	for i, tpl := range []string{"base", "tplcode", "base", "tplcode"} {
		id := "s" + string(rune('1'+i))
		started[id] = t0.Add(time.Duration(i) * time.Minute)
		r := orchestrator.Record{ID: id, TemplateID: tpl, State: orchestrator.Paused, Snapshot: filepath.Join(dir, "snap-"+id),
			StartedAt: started[id], EndAt: started[id].Add(time.Hour)}
		if err := os.MkdirAll(r.Snapshot, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := st.Put(store.Sandboxes, r.ID, r); err != nil {
			t.Fatal(err)
		}
	}
	tpl := template.Template{ID: "tplcode", Names: []string{"code-interpreter"}, Status: "waiting", CreatedAt: t0}
	if err := st.Put(store.Templates, tpl.ID, tpl); err != nil {
		t.Fatal(err)
	}
	o, err := orchestrator.New(t.Context(), orchestrator.Options{DataDir: dir, Store: st, Storage: disktest.Devices(t), VCPUs: 1, MemoryMiB: 256})
	if err != nil {
		t.Fatal(err)
	}
	if err := o.EnableBuilds(t.Context(), template.ImageOptions{Pull: oci.Options{CacheDir: filepath.Join(dir, "oci")}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(o.CloseBuilds)
	return NewHandler(Options{Orchestrator: o, APIKey: testKey, DefaultTimeout: 15 * time.Second, MaxTimeout: time.Hour}), started
}

// listIDs runs GET path and returns the listed ids and the next-page token.
func listIDs(t *testing.T, h http.Handler, path string) ([]string, string) {
	t.Helper()
	w := do(h, "GET", path, testKey, "")
	if w.Code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, w.Code, w.Body)
	}
	var got []wire.ListedSandbox
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	ids := []string{}
	for _, s := range got {
		ids = append(ids, s.SandboxID)
	}
	return ids, w.Header().Get("X-Next-Token")
}

// TestListV2OrderAndFilters: GET /v2/sandboxes sorts by start time as
// `order` asks (desc by default, across pages), keeps only sandboxes started
// at or after `startedAfter` (and before `startedBefore`), and filters by
// `template`, an id or a name, as E2B's API does.
func TestListV2OrderAndFilters(t *testing.T) {
	h, started := listTestHandler(t)
	iso := func(tm time.Time) string { return url.QueryEscape(tm.Format("2006-01-02T15:04:05.000Z07:00")) } // JS toISOString
	cases := []struct {
		query string
		want  string
	}{
		{"", "s4 s3 s2 s1"},
		{"order=desc", "s4 s3 s2 s1"},
		{"order=asc", "s1 s2 s3 s4"},
		{"startedAfter=" + iso(started["s2"]), "s4 s3 s2"}, // at or after
		{"startedAfter=" + iso(started["s2"].Add(time.Millisecond)), "s4 s3"},
		{"startedAfter=" + url.QueryEscape(started["s3"].In(time.FixedZone("x", 3600)).Format(time.RFC3339)) + "&order=asc", "s3 s4"},
		{"startedBefore=" + iso(started["s3"]), "s2 s1"}, // strictly before
		{"startedAfter=" + iso(started["s2"]) + "&startedBefore=" + iso(started["s4"]), "s3 s2"},
		{"template=base", "s3 s1"},
		{"template=tplcode&order=asc", "s2 s4"},
		{"template=code-interpreter", "s4 s2"},
		{"template=no-such-template", ""},
		{"template=base&startedAfter=" + iso(started["s2"]), "s3"},
	}
	for _, c := range cases {
		ids, next := listIDs(t, h, "/v2/sandboxes?"+c.query)
		if got := strings.Join(ids, " "); got != c.want || next != "" {
			t.Errorf("GET /v2/sandboxes?%s: [%s] next %q, want [%s] and no next page", c.query, got, next, c.want)
		}
	}
	for _, bad := range []string{"order=sideways", "startedAfter=yesterday", "startedBefore=2026-13-01T00:00:00Z"} {
		w := do(h, "GET", "/v2/sandboxes?"+bad, testKey, "")
		if w.Code != http.StatusBadRequest {
			t.Errorf("GET /v2/sandboxes?%s: %d, want 400", bad, w.Code)
		}
		checkError(t, w)
	}
}

// TestListV2PagesFollowOrder: pages continue in the order asked for, and a
// token of one order is refused for the other.
func TestListV2PagesFollowOrder(t *testing.T) {
	h, _ := listTestHandler(t)
	for order, want := range map[string][]string{"asc": {"s1", "s2", "s3", "s4"}, "desc": {"s4", "s3", "s2", "s1"}} {
		var all []string
		token, pages := "", 0
		for {
			path := "/v2/sandboxes?limit=3&order=" + order
			if token != "" {
				path += "&nextToken=" + url.QueryEscape(token)
			}
			ids, next := listIDs(t, h, path)
			all = append(all, ids...)
			pages++
			if next == "" || pages > 3 {
				break
			}
			token = next
		}
		if !slices.Equal(all, want) || pages != 2 {
			t.Errorf("order=%s: %v in %d pages, want %v in 2", order, all, pages, want)
		}
		other := map[string]string{"asc": "desc", "desc": "asc"}[order]
		_, tok := listIDs(t, h, "/v2/sandboxes?limit=1&order="+order)
		w := do(h, "GET", "/v2/sandboxes?order="+other+"&nextToken="+url.QueryEscape(tok), testKey, "")
		if w.Code != http.StatusBadRequest {
			t.Errorf("a %s token with order=%s: %d %s, want 400", order, other, w.Code, w.Body)
		}
	}
}
