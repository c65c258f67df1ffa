package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/snapshot"
)

// TestVolumes runs volumes.mjs, E2B's Volume class and volumeMounts on
// create, through each SDK version; the cold resume (a boot under TCG)
// with the newest only.
func TestVolumes(t *testing.T) {
	eachSDK(t, sharedNode(t), sdkScenario{script: "volumes.mjs", name: "volumes", limit: 12 * time.Minute,
		lastEnv: []string{"AENV_VOLUME_COLD=1"}})
}

// TestVolumeFork: fork children of a sandbox with a read-write volume each
// mount a copy-on-write view of the volume as of the fork at the same path
// and diverge from the parent; what they write never reaches the volume,
// what the parent writes does (a new sandbox reads it after the parent's
// kill, also after a kill -9 of aenvd in between); a snapshot keeps its
// copy of the volume after the volume is deleted.
func TestVolumeFork(t *testing.T) {
	n := sharedNode(t)
	var vol struct {
		VolumeID string `json:"volumeID"`
	}
	b := n.expect(t, http.StatusCreated, "POST", "/volumes", n.key, `{"name":"fork-vol","sizeMiB":64}`)
	if err := json.Unmarshal(b, &vol); err != nil || vol.VolumeID == "" {
		t.Fatalf("create volume: %s (%v)", b, err)
	}
	t.Cleanup(func() { n.call(t, "DELETE", "/volumes/"+vol.VolumeID, n.key, "") })
	mounts := `"volumeMounts":[{"name":"fork-vol","path":"/mnt/v"}]`
	parent := n.create(t, `{"templateID":"base","timeout":600,`+mounts+`}`)
	read := `cat /mnt/v/f`
	n.sh(t, parent, `echo parent-v1 > /mnt/v/f`)

	ids := append([]string{parent}, n.forkChildren(t, parent, 2)...)
	for _, kid := range ids[1:] {
		if got := n.sh(t, kid, read); got != "parent-v1" {
			t.Fatalf("fork child %s reads %q, want the parent's parent-v1", kid, got)
		}
	}
	for i, id := range ids {
		n.sh(t, id, fmt.Sprintf(`echo writer-%d > /mnt/v/f`, i))
	}
	for i, id := range ids {
		if got := n.sh(t, id, read); got != fmt.Sprintf("writer-%d", i) {
			t.Fatalf("sandbox %s reads %q after the others wrote, want writer-%d", id, got, i)
		}
	}
	// aenvd killed: the parent is taken over with its mount, and the
	// volume store, reloaded, still knows it holds the volume.
	n.restart(t, syscall.SIGKILL)
	if got := n.sh(t, parent, read); got != "writer-0" {
		t.Fatalf("after the restart the parent reads %q, want writer-0", got)
	}
	// The parent holds the volume: another read-write mount is refused.
	n.expect(t, http.StatusConflict, "POST", "/sandboxes", n.key, `{"templateID":"base",`+mounts+`}`)
	var snap struct {
		SnapshotID string `json:"snapshotID"`
	}
	b = n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+parent+"/snapshots", n.key, "")
	if err := json.Unmarshal(b, &snap); err != nil || snap.SnapshotID == "" {
		t.Fatalf("snapshot: %s (%v)", b, err)
	}
	t.Cleanup(func() { n.call(t, "DELETE", "/snapshots/"+snap.SnapshotID, n.key, "") })
	for _, id := range ids {
		n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, n.key, "")
	}

	next := n.create(t, `{"templateID":"base","timeout":300,`+mounts+`}`)
	if got := n.sh(t, next, read); got != "writer-0" {
		t.Fatalf("after the kills the volume reads %q, want the parent's writer-0 (a child's write reached it?)", got)
	}
	n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+next, n.key, "")
	n.expect(t, http.StatusNoContent, "DELETE", "/volumes/"+vol.VolumeID, n.key, "")
	fromSnap := n.create(t, `{"templateID":"`+snap.SnapshotID+`","timeout":300}`)
	if got := n.sh(t, fromSnap, read); got != "writer-0" {
		t.Fatalf("a sandbox of the snapshot reads %q after the volume was deleted, want writer-0", got)
	}
}

// TestVolumeCrash: aenvd crashed at each durable step of a volume's create
// and of a writer's kill. After the restart an interrupted create left no
// volume and no directory; an interrupted kill left the sandbox gone, the
// volume free and as the last finished session left it (the interrupted
// session's writes are lost, as documented), with no file its record does
// not name, and nothing of the node orphaned.
func TestVolumeCrash(t *testing.T) {
	n := sharedNode(t)
	n.crashAt(t, "volume/create/layer", func() { _, _, _, _ = n.Call("POST", "/volumes", n.key, `{"name":"crash-create"}`) })
	n.expect(t, http.StatusNotFound, "GET", "/volumes/crash-create", n.key, "")
	if entries, err := os.ReadDir(filepath.Join(n.DataDir, "volumes")); err != nil || len(entries) != 0 {
		t.Fatalf("volumes after a crashed create: %v (%v)", entries, err)
	}

	for i, point := range []string{"orchestrator/kill/recorded", "volume/commit/adopted"} {
		t.Run(point, func(t *testing.T) {
			name := fmt.Sprintf("crash-kill-%d", i)
			var vol struct {
				VolumeID string `json:"volumeID"`
			}
			b := n.expect(t, http.StatusCreated, "POST", "/volumes", n.key, `{"name":"`+name+`","sizeMiB":64}`)
			if err := json.Unmarshal(b, &vol); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { n.call(t, "DELETE", "/volumes/"+vol.VolumeID, n.key, "") })
			create := `{"templateID":"base","timeout":300,"volumeMounts":[{"name":"` + name + `","path":"/mnt/v"}]}`
			first := n.create(t, create)
			n.sh(t, first, `echo session-1 > /mnt/v/f`)
			n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+first, n.key, "")
			second := n.create(t, create)
			n.sh(t, second, `echo session-2 > /mnt/v/f`)
			n.crashAt(t, point, func() { _, _, _, _ = n.Call("DELETE", "/sandboxes/"+second, n.key, "") })
			n.expect(t, http.StatusNotFound, "GET", "/sandboxes/"+second, n.key, "")
			var got struct {
				MountedBy []string `json:"mountedBy"`
			}
			if err := json.Unmarshal(n.expect(t, http.StatusOK, "GET", "/volumes/"+vol.VolumeID, n.key, ""), &got); err != nil || len(got.MountedBy) != 0 {
				t.Fatalf("volume after the crashed kill: mounted by %v (%v)", got.MountedBy, err)
			}
			checkVolumeDir(t, filepath.Join(n.DataDir, "volumes", vol.VolumeID))
			third := n.create(t, create)
			if got := n.sh(t, third, `cat /mnt/v/f`); got != "session-1" {
				t.Fatalf("after a kill crashed at %s the volume reads %q, want the last finished session's session-1", point, got)
			}
			n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+third, n.key, "")
			n.checkNoOrphans(t)
		})
	}
}

// checkVolumeDir asserts that a volume's directory holds its record, its
// config and the layers the config lists, and nothing else.
func checkVolumeDir(t *testing.T, dir string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "volume.json"))
	var rec struct {
		Config string `json:"config"`
	}
	if err == nil {
		err = json.Unmarshal(b, &rec)
	}
	if err != nil {
		t.Fatalf("volume record: %v", err)
	}
	layers, err := snapshot.LayersOf(rec.Config)
	if err != nil {
		t.Fatalf("volume config: %v", err)
	}
	want := map[string]bool{"volume.json": true, filepath.Base(rec.Config): true}
	for _, l := range layers {
		want[filepath.Base(l)] = true
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if !want[e.Name()] {
			t.Errorf("volume directory holds %s, which its record does not name", e.Name())
		}
	}
}
