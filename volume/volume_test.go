package volume

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/storage/image"
)

func open(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir, Options{DefaultSizeMiB: 32})
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	return s
}

// TestCreateListGetDelete: a volume is a formatted sealed layer of its size
// (the default when none is asked), found by id and by name, kept across a
// reopen, and gone after a delete; bad names and sizes are 400, a taken
// name 409, an unknown volume 404.
func TestCreateListGetDelete(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	ctx := t.Context()
	v, err := s.Create(ctx, "data", 0)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if v.SizeMiB != 32 || v.Config == "" || v.ID == "" {
		t.Fatalf("created %+v", v)
	}
	layers, err := snapshot.LayersOf(v.Config)
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers of a new volume: %v (%v)", layers, err)
	}
	if st, err := os.Stat(layers[0]); err != nil || st.Size() == 0 {
		t.Fatalf("base layer: %v", err)
	}
	big, err := s.Create(ctx, "big", 64)
	if err != nil || big.SizeMiB != 64 {
		t.Fatalf("create of 64 MiB: %+v (%v)", big, err)
	}
	for name, size := range map[string]int{"": 0, "-x": 0, "a/b": 0, strings.Repeat("a", 64): 0, "small": 8, "huge": MaxSizeMiB + 1, "neg": -1} {
		if _, err := s.Create(ctx, name, size); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("create %q of %d MiB: %v, want invalid", name, size, err)
		}
	}
	if _, err := s.Create(ctx, "data", 0); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("second create of data: %v, want conflict", err)
	}
	if got, err := s.Get("data"); err != nil || got.ID != v.ID {
		t.Errorf("get by name: %+v (%v)", got, err)
	}
	s = open(t, dir)
	if got, err := s.Get(v.ID); err != nil || got.Name != "data" || got.Config != v.Config {
		t.Errorf("get by id after reopen: %+v (%v)", got, err)
	}
	if l := s.List(); len(l) != 2 || l[0].ID != v.ID || l[1].ID != big.ID {
		t.Errorf("list: %+v", l)
	}
	if err := s.Delete(v.ID); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, err := s.Get(v.ID); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("get after delete: %v, want not found", err)
	}
	if err := s.Delete("data"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("second delete: %v, want not found", err)
	}
	if _, err := os.Stat(filepath.Join(dir, v.ID)); !os.IsNotExist(err) {
		t.Errorf("directory of a deleted volume: %v", err)
	}
}

// TestMounts: one writer or many readers; a mounted volume cannot be
// deleted; a commit adopts the writer's layers (they outlive its
// directory) and releases it; ReleaseAbsent frees mounts of sandboxes
// that are gone; the holders survive a reopen.
func TestMounts(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	ctx := t.Context()
	v, err := s.Create(ctx, "vol", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Acquire("nosuch", "sb1", false); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("acquire of an unknown volume: %v", err)
	}
	if _, err := s.Acquire("vol", "sb1", false); err != nil {
		t.Fatalf("acquire rw: %v", err)
	}
	for _, ro := range []bool{false, true} {
		if _, err := s.Acquire("vol", "sb2", ro); !errors.Is(err, errdefs.ErrConflict) {
			t.Errorf("acquire (readOnly %v) while written: %v, want conflict", ro, err)
		}
	}
	if err := s.Delete("vol"); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("delete while mounted: %v, want conflict", err)
	}
	if err := s.Commit(v.ID, "sb2", v.Config, dir); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("commit by a sandbox that is no writer: %v", err)
	}

	// The writer's sealed upper: a layer in its own directory on top.
	owner := t.TempDir()
	if err := FormatExt4(ctx, filepath.Join(owner, "upper"), 16<<20); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(owner, "drive.json")
	if err := snapshot.WriteImageConfig(cfg, append(snapshot.Refs(v.Config), filepath.Join(owner, "upper.lsmt"))); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(v.ID, "sb1", cfg, owner); err != nil {
		t.Fatalf("commit: %v", err)
	}
	if err := os.RemoveAll(owner); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(v.ID)
	if err != nil || got.InUse() || got.Gen != 1 {
		t.Fatalf("after commit: %+v (%v)", got, err)
	}
	layers, err := snapshot.LayersOf(got.Config)
	if err != nil || len(layers) != 2 || !strings.HasPrefix(layers[1], filepath.Join(dir, v.ID)+"/") {
		t.Fatalf("layers after commit: %v (%v)", layers, err)
	}
	for _, l := range layers {
		if _, err := os.Stat(l); err != nil {
			t.Errorf("layer %s: %v", l, err)
		}
	}

	for _, sb := range []string{"r1", "r2"} {
		if _, err := s.Acquire(v.ID, sb, true); err != nil {
			t.Fatalf("acquire ro by %s: %v", sb, err)
		}
	}
	if _, err := s.Acquire(v.ID, "w", false); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("acquire rw while read: %v, want conflict", err)
	}
	s = open(t, dir)
	if got, _ := s.Get(v.ID); !slices.Equal(got.Holders(), []string{"r1", "r2"}) {
		t.Fatalf("holders after reopen: %v", got.Holders())
	}
	if err := s.Release(v.ID, "r1"); err != nil {
		t.Fatal(err)
	}
	s.ReleaseAbsent(func(id string) bool { return id != "r2" })
	if got, _ := s.Get(v.ID); got.InUse() {
		t.Fatalf("still held: %v", got.Holders())
	}
	if err := s.Delete(v.ID); err != nil {
		t.Fatalf("delete after release: %v", err)
	}
}

// TestOpenRemovesUnrecorded: a volume directory without a record (a create
// a crash interrupted) is removed.
func TestOpenRemovesUnrecorded(t *testing.T) {
	dir := t.TempDir()
	stray := filepath.Join(dir, "abc")
	if err := os.MkdirAll(stray, 0o700); err != nil {
		t.Fatal(err)
	}
	s := open(t, dir)
	if _, err := os.Stat(stray); !os.IsNotExist(err) || len(s.List()) != 0 {
		t.Fatalf("stray directory: %v, volumes %v", err, s.List())
	}
}

// TestFaultPoints: an error at each durable step of a create or a commit
// leaves the store as before the call, on disk too (a reopen agrees).
func TestFaultPoints(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	ctx := t.Context()
	arm := func(name string) {
		t.Helper()
		if err := failpoint.Arm(name, "error"); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { failpoint.Arm(name, "") })
	}
	arm("volume/create/layer")
	if _, err := s.Create(ctx, "v", 0); !errors.Is(err, failpoint.ErrInjected) {
		t.Fatalf("create at the armed point: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 || len(s.List()) != 0 {
		t.Fatalf("a failed create left %v, volumes %v", entries, s.List())
	}
	failpoint.Arm("volume/create/layer", "")
	v, err := s.Create(ctx, "v", 0)
	if err != nil {
		t.Fatalf("create after disarming (the name is free again): %v", err)
	}
	if _, err := s.Acquire("v", "sb", false); err != nil {
		t.Fatal(err)
	}
	owner := t.TempDir()
	if err := FormatExt4(ctx, filepath.Join(owner, "upper"), 16<<20); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(owner, "drive.json")
	if err := snapshot.WriteImageConfig(cfg, append(snapshot.Refs(v.Config), filepath.Join(owner, "upper.lsmt"))); err != nil {
		t.Fatal(err)
	}
	arm("volume/commit/adopted")
	if err := s.Commit(v.ID, "sb", cfg, owner); !errors.Is(err, failpoint.ErrInjected) {
		t.Fatalf("commit at the armed point: %v", err)
	}
	for _, st := range []*Store{s, open(t, dir)} {
		got, err := st.Get(v.ID)
		if err != nil || got.Writer != "sb" || got.Config != v.Config || got.Gen != 0 {
			t.Fatalf("after a failed commit: %+v (%v)", got, err)
		}
	}
	failpoint.Arm("volume/commit/adopted", "")
	if err := s.Commit(v.ID, "sb", cfg, owner); err != nil {
		t.Fatalf("commit retried: %v", err)
	}
	if got, _ := s.Get(v.ID); got.Gen != 1 || got.InUse() || len(snapshot.Refs(got.Config)) != 2 {
		t.Fatalf("after the retried commit: %+v", got)
	}
}

// commitLayer has sandbox sb mount v read-write, write marker at off on a
// fresh upper over the volume's chain, seal it and commit it.
func commitLayer(t *testing.T, s *Store, id, sb string, off int64, marker string) {
	t.Helper()
	v, err := s.Acquire(id, sb, false)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	owner := t.TempDir()
	lowers := snapshot.Refs(v.Config)
	if _, err := image.Create(ctx, filepath.Join(owner, "upper.json"), image.CreateSpec{Lowers: lowers}); err != nil {
		t.Fatal(err)
	}
	im, err := image.Open(ctx, filepath.Join(owner, "upper.json"), image.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := im.WriteAt([]byte(marker), off); err != nil {
		t.Fatal(err)
	}
	if _, err := im.Commit(ctx, filepath.Join(owner, "upper.lsmt"), image.CommitOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := im.Close(); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(owner, "drive.json")
	if err := snapshot.WriteImageConfig(cfg, append(lowers, filepath.Join(owner, "upper.lsmt"))); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(id, sb, cfg, owner); err != nil {
		t.Fatal(err)
	}
}

// TestCompact: a chain deeper than MaxLayers is merged into one layer once
// no sandbox mounts the volume (not while one does); the merged-away files
// go, and files no record names are removed on Open.
func TestCompact(t *testing.T) {
	dir := t.TempDir()
	s := open(t, dir)
	v, err := s.Create(t.Context(), "deep", 16)
	if err != nil {
		t.Fatal(err)
	}
	marker := func(i int) string { return fmt.Sprintf("commit-%d", i) }
	for i := 0; i < MaxLayers; i++ {
		commitLayer(t, s, v.ID, "sb", int64(i)<<20, marker(i))
	}
	vdir := filepath.Join(dir, v.ID)
	if _, err := s.Acquire(v.ID, "reader", true); err != nil {
		t.Fatal(err)
	}
	if err := s.Compact(t.Context(), v.ID); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Get(v.ID); len(snapshot.Refs(got.Config)) != MaxLayers+1 {
		t.Fatalf("a mounted volume was merged: %d layers", len(snapshot.Refs(got.Config)))
	}
	if err := s.Release(v.ID, "reader"); err != nil {
		t.Fatal(err)
	}
	// A merge that fails after its layer and config are written leaves the
	// record on the old chain; a reopen agrees and removes what it wrote.
	if err := failpoint.Arm("volume/compact/merged", "error"); err != nil {
		t.Fatal(err)
	}
	if err := s.Compact(t.Context(), v.ID); !errors.Is(err, failpoint.ErrInjected) {
		t.Fatalf("compact at the armed point: %v", err)
	}
	failpoint.Arm("volume/compact/merged", "")
	before, _ := s.Get(v.ID)
	s = open(t, dir)
	if again, err := s.Get(v.ID); err != nil || again.Config != before.Config || len(snapshot.Refs(again.Config)) != MaxLayers+1 {
		t.Fatalf("after a failed merge and a reopen: %+v (%v)", again, err)
	}
	if _, err := os.Stat(filepath.Join(vdir, fmt.Sprintf("image-%d.json", before.Gen+1))); !os.IsNotExist(err) {
		t.Fatalf("the failed merge's config survived Open: %v", err)
	}
	if err := s.Compact(t.Context(), v.ID); err != nil {
		t.Fatal(err)
	}
	got, _ := s.Get(v.ID)
	layers := snapshot.Refs(got.Config)
	if len(layers) != 1 || filepath.Dir(layers[0]) != vdir {
		t.Fatalf("after the merge: %v", layers)
	}
	entries, _ := os.ReadDir(vdir)
	if len(entries) != 3 { // volume.json, the config, the merged layer
		t.Fatalf("volume directory after the merge: %v", entries)
	}
	stray := filepath.Join(vdir, "layer-99-0.lsmt")
	if err := os.WriteFile(stray, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	s = open(t, dir)
	if _, err := os.Stat(stray); !os.IsNotExist(err) {
		t.Fatalf("a file no record names survived Open: %v", err)
	}
	if got2, err := s.Get(v.ID); err != nil || got2.Config != got.Config {
		t.Fatalf("after reopen: %+v (%v)", got2, err)
	}
	// The merged layer holds what every commit wrote.
	im, err := image.OpenLayers(t.Context(), snapshot.Refs(got.Config), image.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	for i := 0; i < MaxLayers; i++ {
		buf := make([]byte, len(marker(i)))
		if _, err := im.ReadAt(buf, int64(i)<<20); err != nil || string(buf) != marker(i) {
			t.Fatalf("merged volume at %d MiB: %q (%v), want %q", i, buf, err, marker(i))
		}
	}
}
