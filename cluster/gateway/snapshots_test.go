package gateway

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"testing"
	"time"
)

// listSnaps pages the fake node's snapshots as aenvd does: newest first, a
// token naming the last one listed.
func (f *fakeNode) listSnaps(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
	if limit == 0 {
		limit = 100
	}
	start := 0
	if tok := r.URL.Query().Get("nextToken"); tok != "" {
		start = slices.IndexFunc(f.snaps, func(s map[string]any) bool { return s["snapshotID"] == tok }) + 1
		if start == 0 {
			writeError(w, http.StatusBadRequest, "nextToken names no snapshot")
			return
		}
	}
	end := min(start+limit, len(f.snaps))
	if end < len(f.snaps) {
		w.Header().Set("X-Next-Token", f.snaps[end-1]["snapshotID"].(string))
	}
	writeJSON(w, http.StatusOK, f.snaps[start:end])
}

// TestSnapshotsPagedAcrossNodes: pages of /snapshots through the gateway
// list every node's snapshots once, newest first, whatever the page size.
func TestSnapshotsPagedAcrossNodes(t *testing.T) {
	fx := newFixture(t, "a", "b", "c")
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var want []string
	for i := 30; i > 0; i-- { // newest first; spread over the nodes unevenly
		f := fx.nodes[(i*i)%3]
		id := fmt.Sprintf("%s-snap%02d", f.name, i)
		created := base.Add(time.Duration(i/2) * time.Minute) // pairs share a time
		f.snaps = append(f.snaps, map[string]any{"snapshotID": id, "createdAt": created})
		want = append(want, id)
	}
	for _, limit := range []int{1, 4, 7, 100} {
		var got []string
		tok := ""
		for pages := 0; ; pages++ {
			if pages > 40 {
				t.Fatalf("limit %d: no end after %d pages", limit, pages)
			}
			q := url.Values{"limit": {strconv.Itoa(limit)}}
			if tok != "" {
				q.Set("nextToken", tok)
			}
			code, b, h := fx.do(t, "GET", "/snapshots?"+q.Encode(), "", "")
			var page []struct {
				SnapshotID string    `json:"snapshotID"`
				CreatedAt  time.Time `json:"createdAt"`
			}
			if err := json.Unmarshal(b, &page); code != http.StatusOK || err != nil || len(page) > limit {
				t.Fatalf("limit %d, page %d: %d %s", limit, pages, code, b)
			}
			for _, s := range page {
				got = append(got, s.SnapshotID)
			}
			if tok = h.Get("X-Next-Token"); tok == "" {
				break
			}
		}
		if len(got) != len(want) || len(slices.Compact(slices.Sorted(slices.Values(got)))) != len(want) {
			t.Fatalf("limit %d: listed %d (%v), want each of the %d once", limit, len(got), got, len(want))
		}
		var times []time.Time
		for _, id := range got {
			for _, f := range fx.nodes {
				for _, s := range f.snaps {
					if s["snapshotID"] == id {
						times = append(times, s["createdAt"].(time.Time))
					}
				}
			}
		}
		if !slices.IsSortedFunc(times, func(a, b time.Time) int { return b.Compare(a) }) {
			t.Fatalf("limit %d: not newest first: %v", limit, got)
		}
	}
	if code, _, _ := fx.do(t, "GET", "/snapshots?nextToken=not-one*", "", ""); code != http.StatusBadRequest {
		t.Fatalf("a token the gateway never gave: %d, want 400", code)
	}
}
