package api

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentenv/agentenv/disk/disktest"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/snapshot"

	"github.com/agentenv/agentenv/orchestrator"
	"github.com/agentenv/agentenv/store"
)

// TestDeleteSnapshotAsTemplate: DELETE /templates/{id} deletes a snapshot
// that /snapshots lists (E2B's Sandbox.deleteSnapshot), by id and by name,
// and answers 404 once it is gone.
func TestDeleteSnapshotAsTemplate(t *testing.T) {
	dir := t.TempDir()
	st := testStore(t, dir)
	for _, snap := range []snapshot.Record{
		{ID: "snapone", Names: []string{"first"}, TemplateID: "base", SandboxID: "sbxgone", Dir: filepath.Join(dir, "snapone"), CreatedAt: time.Now()},
		{ID: "snaptwo", Names: []string{"second"}, TemplateID: "base", SandboxID: "sbxgone", Dir: filepath.Join(dir, "snaptwo"), CreatedAt: time.Now()},
	} {
		if err := os.MkdirAll(snap.Dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := st.Put(store.Snapshots, snap.ID, snap); err != nil {
			t.Fatal(err)
		}
	}
	o, err := orchestrator.New(t.Context(), orchestrator.Options{DataDir: dir, Store: st, Storage: disktest.Devices(t)})
	if err != nil {
		t.Fatal(err)
	}
	h := NewHandler(Options{Orchestrator: o, APIKey: testKey, DefaultTimeout: 15 * time.Second, MaxTimeout: time.Hour})
	listed := func() []string {
		w := do(h, "GET", "/snapshots", testKey, "")
		var out []wire.SnapshotInfo
		if err := json.Unmarshal(w.Body.Bytes(), &out); w.Code != 200 || err != nil {
			t.Fatalf("GET /snapshots: %d %s", w.Code, w.Body)
		}
		var ids []string
		for _, s := range out {
			ids = append(ids, s.SnapshotID)
		}
		return ids
	}
	if got := listed(); len(got) != 2 {
		t.Fatalf("listed %v, want both snapshots", got)
	}
	for _, c := range []struct{ ref, id string }{{"snapone", "snapone"}, {"second", "snaptwo"}} {
		if w := do(h, "DELETE", "/templates/"+c.ref, testKey, ""); w.Code != http.StatusNoContent {
			t.Fatalf("DELETE /templates/%s: %d %s, want 204", c.ref, w.Code, w.Body)
		}
		if _, err := os.Stat(filepath.Join(dir, c.id)); !os.IsNotExist(err) {
			t.Errorf("snapshot %s's files are still there (%v)", c.id, err)
		}
		w := do(h, "DELETE", "/templates/"+c.ref, testKey, "")
		checkError(t, w)
		if w.Code != http.StatusNotFound {
			t.Errorf("second DELETE /templates/%s: %d %s, want 404", c.ref, w.Code, w.Body)
		}
	}
	if got := listed(); len(got) != 0 {
		t.Errorf("still listed after the deletes: %v", got)
	}
}
