package api

import (
	"encoding/json"
	"github.com/agentenv/agentenv/disk/disktest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/orchestrator"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/store"
)

// TestCreateDrivesRefused: a create with a bad drive list answers 400 in
// E2B's error shape before any template is looked up.
func TestCreateDrivesRefused(t *testing.T) {
	h := newTestHandler(t)
	for _, body := range []string{
		`{"templateID":"base","drives":[{"sizeMiB":8},{"sizeMiB":8},{"sizeMiB":8},{"sizeMiB":8},{"sizeMiB":8}]}`,
		`{"templateID":"base","drives":[{}]}`,
		`{"templateID":"base","drives":[{"image":"base","sizeMiB":8}]}`,
		`{"templateID":"base","drives":[{"sizeMiB":-5}]}`,
		`{"templateID":"base","drives":[{"sizeMiB":65537}]}`,
		`{"templateID":"base","drives":[{"sizeMiB":8,"readOnly":true}]}`,
		`{"templateID":"base","drives":[{"image":"../../etc"}]}`,
		`{"templateID":"base","drives":{"sizeMiB":8}}`,
	} {
		w := do(h, "POST", "/sandboxes", testKey, body)
		if w.Code != 400 {
			t.Errorf("%s: status %d, want 400 (%s)", body, w.Code, w.Body)
			continue
		}
		checkError(t, w)
	}
}

// TestSandboxDetailDrives: GET /sandboxes/{id} lists the drives by guest
// disk.
func TestSandboxDetailDrives(t *testing.T) {
	dir := t.TempDir()
	st := testStore(t, dir)
	r := orchestrator.Record{ID: "sbxdrives", TemplateID: "base", State: orchestrator.Paused, Snapshot: filepath.Join(dir, "s1"),
		DriveSlots: 4, Drives: []orchestrator.AttachedDrive{
			{Drive: snapshot.Drive{Slot: 1, Image: "base", ReadOnly: true, Config: "/x/rootfs.json"}},
			{Drive: snapshot.Drive{Slot: 2, SizeMiB: 64, Config: "/x/drive2.json"}},
		}}
	if err := os.MkdirAll(r.Snapshot, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := st.Put(store.Sandboxes, r.ID, r); err != nil {
		t.Fatal(err)
	}
	o, err := orchestrator.New(t.Context(), orchestrator.Options{DataDir: dir, Store: st, Storage: disktest.Devices(t)})
	if err != nil {
		t.Fatal(err)
	}
	h := NewHandler(Options{Orchestrator: o, APIKey: testKey, DefaultTimeout: 15 * time.Second, MaxTimeout: time.Hour})
	w := do(h, "GET", "/sandboxes/sbxdrives", testKey, "")
	var d wire.SandboxDetail
	if err := json.Unmarshal(w.Body.Bytes(), &d); w.Code != 200 || err != nil || d.Drives == nil {
		t.Fatalf("GET: %d %s %v", w.Code, w.Body, err)
	}
	got := *d.Drives
	if len(got) != 2 || got[0].Device != "vdb" || !got[0].ReadOnly || got[0].Image == nil || *got[0].Image != "base" || got[0].SizeMiB != nil ||
		got[1].Device != "vdc" || got[1].ReadOnly || got[1].Image != nil || got[1].SizeMiB == nil || *got[1].SizeMiB != 64 {
		t.Fatalf("drives %s", w.Body)
	}
}
