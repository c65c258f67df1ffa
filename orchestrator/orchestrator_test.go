package orchestrator

import (
	"errors"
	"github.com/agentenv/agentenv/disk/disktest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentenv/agentenv/store"
)

// TestLoadKeepsPausedDropsTheRest: without a VMM, New keeps paused records
// whose snapshot exists, or filesystem-only ones whose disk exists, and
// drops every other.
func TestLoadKeepsPausedDropsTheRest(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	snap := t.TempDir()
	disk := filepath.Join(t.TempDir(), "rootfs.img")
	if err := os.WriteFile(disk, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	recs := []Record{
		{ID: "paused1", State: Paused, Snapshot: snap, RootfsImage: disk, Dir: t.TempDir(), StartedAt: time.Now()},
		{ID: "fsonly1", State: Paused, FilesystemOnly: true, RootfsImage: disk, Dir: t.TempDir()},
		{ID: "fsonly2", State: Paused, FilesystemOnly: true, RootfsImage: filepath.Join(dir, "gone"), Snapshot: snap, Dir: t.TempDir()},
		{ID: "paused2", State: Paused, Snapshot: filepath.Join(dir, "gone"), RootfsImage: disk, Dir: t.TempDir()},
		{ID: "running1", State: Running, Dir: t.TempDir()},
	}
	for _, r := range recs {
		if err := st.Put(store.Sandboxes, r.ID, r); err != nil {
			t.Fatal(err)
		}
	}
	o, err := New(t.Context(), Options{DataDir: dir, Store: st, Storage: disktest.Devices(t)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.Get("fsonly1"); err != nil {
		t.Fatalf("filesystem-only paused sandbox with its disk: %v", err)
	}
	if err := o.Kill(t.Context(), "fsonly1"); err != nil {
		t.Fatalf("kill of a filesystem-only paused sandbox: %v", err)
	}
	list := o.List()
	if len(list) != 1 || list[0].ID != "paused1" || list[0].State != Paused {
		t.Fatalf("loaded %+v, want only paused1", list)
	}
	left, _ := store.ListAll[Record](st, store.Sandboxes)
	if len(left) != 1 || left[0].ID != "paused1" {
		t.Fatalf("store after load: %+v", left)
	}
	if err := o.Pause(t.Context(), "paused1", true); !errors.Is(err, ErrConflict) {
		t.Fatalf("pause of a paused sandbox: %v, want ErrConflict", err)
	}
	if err := o.Kill(t.Context(), "running1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("kill of a dropped sandbox: %v, want ErrNotFound", err)
	}
	if err := o.Kill(t.Context(), "paused1"); err != nil {
		t.Fatalf("kill of a paused sandbox: %v", err)
	}
	if err := o.Kill(t.Context(), "paused1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second kill: %v, want ErrNotFound", err)
	}
	if left, _ := store.ListAll[Record](st, store.Sandboxes); len(left) != 0 || len(o.List()) != 0 {
		t.Fatalf("after kill: store %+v, list %+v", left, o.List())
	}
}
