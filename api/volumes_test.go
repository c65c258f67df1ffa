package api

import (
	"encoding/json"
	"github.com/agentenv/agentenv/disk/disktest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/orchestrator"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/store"
	"github.com/agentenv/agentenv/volume"
)

// TestVolumesAPI: E2B's /volumes routes over the node's real volume store:
// create (201, E2B's VolumeAndToken), list, get by id and by name, delete;
// bad names are 400, a taken name 409, an unknown volume 404.
func TestVolumesAPI(t *testing.T) {
	h := newTestHandler(t)
	w := do(h, "POST", "/volumes", testKey, `{"name":"data","sizeMiB":32}`)
	var v wire.VolumeAndToken
	if err := json.Unmarshal(w.Body.Bytes(), &v); w.Code != 201 || err != nil || v.VolumeID == "" || v.Name != "data" ||
		v.SizeMiB == nil || *v.SizeMiB != 32 || !strings.Contains(w.Body.String(), `"token":""`) {
		t.Fatalf("POST /volumes: %d %s (%v)", w.Code, w.Body, err)
	}
	for body, status := range map[string]int{
		`{"name":"data"}`: 409, `{"name":""}`: 400, `{"name":"../x"}`: 400, `{}`: 400, `{"name":"x","sizeMiB":1}`: 400, `[1]`: 400,
	} {
		w := do(h, "POST", "/volumes", testKey, body)
		if w.Code != status {
			t.Errorf("POST /volumes %s: %d, want %d (%s)", body, w.Code, status, w.Body)
		}
		checkError(t, w)
	}
	w = do(h, "GET", "/volumes", testKey, "")
	var list []wire.Volume
	if err := json.Unmarshal(w.Body.Bytes(), &list); w.Code != 200 || err != nil || len(list) != 1 || list[0].VolumeID != v.VolumeID || list[0].Name != "data" {
		t.Fatalf("GET /volumes: %d %s (%v)", w.Code, w.Body, err)
	}
	for _, ref := range []string{v.VolumeID, "data"} {
		w = do(h, "GET", "/volumes/"+ref, testKey, "")
		var got wire.VolumeAndToken
		if err := json.Unmarshal(w.Body.Bytes(), &got); w.Code != 200 || err != nil || got.VolumeID != v.VolumeID {
			t.Errorf("GET /volumes/%s: %d %s (%v)", ref, w.Code, w.Body, err)
		}
	}
	if w = do(h, "GET", "/volumes/nosuch", testKey, ""); w.Code != 404 {
		t.Errorf("GET of an unknown volume: %d", w.Code)
	}
	if w = do(h, "GET", "/volumes", "", ""); w.Code != 401 {
		t.Errorf("GET /volumes without a key: %d", w.Code)
	}
	if w = do(h, "DELETE", "/volumes/"+v.VolumeID, testKey, ""); w.Code != 204 {
		t.Fatalf("DELETE: %d %s", w.Code, w.Body)
	}
	if w = do(h, "DELETE", "/volumes/"+v.VolumeID, testKey, ""); w.Code != 404 {
		t.Errorf("second DELETE: %d", w.Code)
	}
}

// TestCreateVolumeMountsRefused: bad volume mounts answer 400 before any
// template or volume is looked up.
func TestCreateVolumeMountsRefused(t *testing.T) {
	h := newTestHandler(t)
	for _, body := range []string{
		`{"templateID":"base","volumeMounts":[{"name":"v","path":"relative"}]}`,
		`{"templateID":"base","volumeMounts":[{"name":"v","path":"/"}]}`,
		`{"templateID":"base","volumeMounts":[{"name":"v","path":"/a/../b"}]}`,
		`{"templateID":"base","volumeMounts":[{"name":"","path":"/mnt"}]}`,
		`{"templateID":"base","volumeMounts":[{"name":"v","path":"/mnt"},{"name":"w","path":"/mnt"}]}`,
		`{"templateID":"base","volumeMounts":[{"name":"v","path":"/mnt/` + strings.Repeat("x", 1100) + `"}]}`,
		`{"templateID":"base","volumeMounts":{"name":"v","path":"/mnt"}}`,
	} {
		w := do(h, "POST", "/sandboxes", testKey, body)
		if w.Code != 400 {
			t.Errorf("%.80s: status %d, want 400 (%s)", body, w.Code, w.Body)
			continue
		}
		checkError(t, w)
	}
}

// TestVolumeOfPausedSandbox: a paused sandbox that mounts a volume lists it
// as volumeMounts (not as a drive), in its detail and in the list; the volume cannot be deleted meanwhile
// (409); its kill commits the layer the
// sandbox sealed on its pause into the volume's own directory and frees
// the volume.
func TestVolumeOfPausedSandbox(t *testing.T) {
	dir := t.TempDir()
	st := testStore(t, dir)
	vols, err := volume.Open(filepath.Join(dir, "volumes"), volume.Options{DefaultSizeMiB: 32})
	if err != nil {
		t.Fatal(err)
	}
	v, err := vols.Create(t.Context(), "work", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := vols.Acquire("work", "sbxvol", false); err != nil {
		t.Fatal(err)
	}
	// The sandbox's directory holds what its pause sealed of the drive.
	sdir := filepath.Join(dir, "sandboxes", "sbxvol")
	if err := os.MkdirAll(sdir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := volume.FormatExt4(t.Context(), filepath.Join(sdir, "drive1-2"), 16<<20); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(sdir, "drive1-2-all.json")
	if err := snapshot.WriteImageConfig(cfg, append(snapshot.Refs(v.Config), filepath.Join(sdir, "drive1-2.lsmt"))); err != nil {
		t.Fatal(err)
	}
	r := orchestrator.Record{ID: "sbxvol", TemplateID: "base", State: orchestrator.Paused, Snapshot: filepath.Join(sdir, "s1"), Dir: sdir,
		DriveSlots: 4, Drives: []orchestrator.AttachedDrive{{Drive: snapshot.Drive{Slot: 1, SizeMiB: 32, Config: cfg, MountPath: "/mnt/work"},
			Volume: v.ID, VolumeName: "work"}}}
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
	w := do(h, "GET", "/sandboxes/sbxvol", testKey, "")
	var d wire.SandboxDetail
	if err := json.Unmarshal(w.Body.Bytes(), &d); w.Code != 200 || err != nil || d.Drives != nil || d.VolumeMounts == nil ||
		len(*d.VolumeMounts) != 1 || (*d.VolumeMounts)[0].Name != "work" || (*d.VolumeMounts)[0].Path != "/mnt/work" {
		t.Fatalf("GET /sandboxes/sbxvol: %d %s (%v)", w.Code, w.Body, err)
	}
	w = do(h, "GET", "/v2/sandboxes?state=paused", testKey, "")
	var listed []wire.ListedSandbox
	if err := json.Unmarshal(w.Body.Bytes(), &listed); w.Code != 200 || err != nil || len(listed) != 1 || listed[0].VolumeMounts == nil ||
		len(*listed[0].VolumeMounts) != 1 || (*listed[0].VolumeMounts)[0].Name != "work" {
		t.Fatalf("GET /v2/sandboxes: %d %s (%v)", w.Code, w.Body, err)
	}
	if w := do(h, "DELETE", "/volumes/work", testKey, ""); w.Code != 409 || !strings.Contains(w.Body.String(), "mounted by sandbox") {
		t.Errorf("DELETE of a mounted volume: %d, want 409 (%s)", w.Code, w.Body)
	}
	if w := do(h, "DELETE", "/sandboxes/sbxvol", testKey, ""); w.Code != 204 {
		t.Fatalf("kill: %d %s", w.Code, w.Body)
	}
	got, err := o.Volumes().Get("work")
	if err != nil || got.InUse() {
		t.Fatalf("volume after the kill: %+v (%v)", got, err)
	}
	layers, err := snapshot.LayersOf(got.Config)
	if err != nil || len(layers) != 2 {
		t.Fatalf("layers after the kill: %v (%v)", layers, err)
	}
	for _, l := range layers {
		if fi, err := os.Stat(l); err != nil || !strings.HasPrefix(l, filepath.Join(dir, "volumes", v.ID)+"/") || fi.Size() == 0 {
			t.Errorf("layer %s: %v", l, err)
		}
	}
	if _, err := os.Stat(sdir); !os.IsNotExist(err) {
		t.Errorf("sandbox directory after the kill: %v", err)
	}
	if w := do(h, "DELETE", "/volumes/work", testKey, ""); w.Code != 204 {
		t.Errorf("DELETE after the kill: %d %s", w.Code, w.Body)
	}
}
