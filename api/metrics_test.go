package api

import (
	"encoding/json"
	"github.com/agentenv/agentenv/disk/disktest"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/metricsring"
	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/orchestrator"
	"github.com/agentenv/agentenv/store"
)

// TestSandboxMetricsRange: GET /sandboxes/{id}/metrics answers the
// history's samples within start..end; GET /sandboxes/metrics leaves out
// what is not running. (Sampling running sandboxes is covered end to end.)
func TestSandboxMetricsRange(t *testing.T) {
	dir := t.TempDir()
	st := testStore(t, dir)
	rec := orchestrator.Record{ID: "sbxpaused", TemplateID: "base", State: orchestrator.Paused, Snapshot: filepath.Join(dir, "s1")}
	if err := os.MkdirAll(rec.Snapshot, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := st.Put(store.Sandboxes, rec.ID, rec); err != nil {
		t.Fatal(err)
	}
	o, err := orchestrator.New(t.Context(), orchestrator.Options{DataDir: dir, Store: st, Storage: disktest.Devices(t)})
	if err != nil {
		t.Fatal(err)
	}
	hist := metricsring.New(o, 0, 0, nil)
	for ts := int64(1000); ts <= 1040; ts += 5 {
		hist.Add(rec.ID, metricsring.Sample{TS: ts, CPUCount: 2, MemUsed: ts})
	}
	h := NewHandler(Options{Orchestrator: o, APIKey: testKey, DefaultTimeout: 15 * time.Second, MaxTimeout: time.Hour, MetricsHistory: hist})
	get := func(q string) []wire.SandboxMetric {
		t.Helper()
		w := do(h, "GET", "/sandboxes/"+rec.ID+"/metrics"+q, testKey, "")
		var out []wire.SandboxMetric
		if err := json.Unmarshal(w.Body.Bytes(), &out); w.Code != 200 || err != nil {
			t.Fatalf("metrics%s: %d %s", q, w.Code, w.Body)
		}
		return out
	}
	for q, want := range map[string][]int64{
		"":                     {1000, 1005, 1010, 1015, 1020, 1025, 1030, 1035, 1040},
		"?start=1012&end=1027": {1015, 1020, 1025},
		"?start=1036":          {1040},
		"?end=1004":            {1000},
		"?start=2000":          {},
	} {
		got := get(q)
		ok := len(got) == len(want)
		for i := 0; ok && i < len(got); i++ {
			ok = got[i].TimestampUnix == want[i] && got[i].Timestamp.Equal(time.Unix(want[i], 0)) && got[i].MemUsed == want[i]
		}
		if !ok {
			t.Errorf("metrics%s: %+v, want timestamps %v", q, got, want)
		}
	}
	for _, q := range []string{"?start=1030&end=1020", "?start=-1"} {
		w := do(h, "GET", "/sandboxes/"+rec.ID+"/metrics"+q, testKey, "")
		checkError(t, w)
		if w.Code != http.StatusBadRequest {
			t.Errorf("metrics%s: %d, want 400", q, w.Code)
		}
	}
	if w := do(h, "GET", "/sandboxes/nosuch/metrics", testKey, ""); w.Code != http.StatusNotFound {
		t.Errorf("metrics of an unknown sandbox: %d, want 404", w.Code)
	}

	w := do(h, "GET", "/sandboxes/metrics?sandbox_ids="+rec.ID+",nosuch", testKey, "")
	var many wire.SandboxesWithMetrics
	if err := json.Unmarshal(w.Body.Bytes(), &many); w.Code != 200 || err != nil || many.Sandboxes == nil || len(many.Sandboxes) != 0 {
		t.Errorf("metrics of a paused and an unknown sandbox: %d %s, want {sandboxes: {}}", w.Code, w.Body)
	}
	for _, q := range []string{"", "?sandbox_ids="} {
		if w := do(h, "GET", "/sandboxes/metrics"+q, testKey, ""); w.Code != http.StatusBadRequest {
			t.Errorf("/sandboxes/metrics%s: %d %s, want 400", q, w.Code, w.Body)
		}
	}
}
