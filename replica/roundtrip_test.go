package replica

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"github.com/agentenv/agentenv/storage/lsmt"
	"github.com/agentenv/agentenv/vmm/memsnap"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentenv/agentenv/config"
	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/snapshot/repo/reponode"
	"github.com/agentenv/agentenv/snapshot/repo/upload"
	"github.com/agentenv/agentenv/storage/blob"
	"github.com/agentenv/agentenv/template"
	"github.com/agentenv/agentenv/vmm"
)

// bringer is a node that brings paused sandboxes: it holds what it
// adopted and serves one template.
type bringer struct {
	Node
	tmpl    *template.Template
	adopted []Paused
	later   []string
}

func (b *bringer) Holds(id string) bool {
	for _, p := range b.adopted {
		if p.ID == id {
			return true
		}
	}
	return false
}
func (b *bringer) AdoptPaused(p Paused) error { b.adopted = append(b.adopted, p); return nil }
func (b *bringer) LayeredDisks() bool         { return true }
func (b *bringer) FetchLater(cfg string)      { b.later = append(b.later, cfg) }
func (b *bringer) Template(id string) (*template.Template, error) {
	if id != b.tmpl.ID {
		return nil, errdefs.ErrNotFound
	}
	return b.tmpl, nil
}

// relocator points a snapshot at a reference by noting it in the config.
type relocator struct{ vmm.Driver }

func (relocator) RelocateSnapshot(dir, reference string) error {
	return os.WriteFile(filepath.Join(dir, "relocated"), []byte(reference), 0o600)
}

func repoNode(t *testing.T, dir string) *reponode.Node {
	t.Helper()
	c := config.Default()
	c.DataDir = t.TempDir()
	c.Repository.Backend, c.Repository.Dir = "posix", dir
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	n, err := reponode.Open(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

func writeFile(t *testing.T, path, data string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// commitPause commits a pause of sandbox sbx1 (generation 3, its memory
// working set file holding ws unless "") to the repository directory
// shared, through a node of its own, and waits for the upload.
func commitPause(t *testing.T, shared, ws string) {
	t.Helper()
	commitPauseWith(t, shared, ws, nil)
}

// commitPauseWith is commitPause whose snapshot directory gets more files
// from extra (a layered memory image) before it is committed.
func commitPauseWith(t *testing.T, shared, ws string, extra func(vm string)) {
	t.Helper()
	ctx := context.Background()
	a := repoNode(t, shared)
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	vm := filepath.Join(src, "snapshot-3")
	if err := os.Mkdir(vm, 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(vm, vmm.SnapshotStateFile), "vm state")
	writeFile(t, filepath.Join(vm, vmm.SnapshotConfigFile), `{"machine":"a"}`)
	writeFile(t, filepath.Join(vm, vmm.SnapshotMemoryFile), "guest memory")
	if ws != "" {
		writeFile(t, filepath.Join(vm, snapshot.WorkingSetFile), ws)
	}
	if extra != nil {
		extra(vm)
	}
	rootfs := filepath.Join(src, "rootfs-3.json")
	if err := snapshot.WriteImageConfig(rootfs, []string{writeFile(t, filepath.Join(src, "base.layer"), "base layer"),
		writeFile(t, filepath.Join(src, "own.layer"), "own layer")}); err != nil {
		t.Fatal(err)
	}
	record := map[string]any{"id": "sbx1", "templateID": "tpl", "gen": 3, "metadata": map[string]string{"k": "v"}}
	ra := New(Options{Uploads: a, Logger: slog.New(slog.DiscardHandler)}, nil)
	ra.CommitPause(ctx, Sandbox{ID: "sbx1", TemplateID: "tpl", Dir: src, Gen: 3, Snapshot: vm, RootfsImage: rootfs, Record: record})
	if st, err := a.Uploads.Wait(ctx, ManifestOfPause("sbx1", 3)); err != nil || st.State != upload.Uploaded {
		t.Fatalf("upload: %+v, %v", st, err)
	}
}

// TestPauseRoundTrip: a pause committed by one node through a real
// repository directory is brought by another: same layers and VM state,
// relocated to the other node's boot files, and its record handed to the
// node to adopt, placed in the next generation of the sandbox's directory
// there. A sandbox the repository has no pause of is not found.
func TestPauseRoundTrip(t *testing.T) {
	ctx := context.Background()
	shared := t.TempDir()
	commitPause(t, shared, "")

	b := repoNode(t, shared)
	dataB := t.TempDir()
	node := &bringer{tmpl: &template.Template{ID: "tpl", Snapshot: "/boot/of/b"}}
	rb := New(Options{Remote: b, DataDir: dataB, Driver: relocator{}, Logger: slog.New(slog.DiscardHandler)}, node)
	if err := rb.ImportPaused(ctx, "other"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("bring a sandbox never paused: %v, want not found", err)
	}
	if err := rb.ImportPaused(ctx, "sbx1"); err != nil {
		t.Fatal(err)
	}
	if len(node.adopted) != 1 {
		t.Fatalf("adopted %d sandboxes, want 1", len(node.adopted))
	}
	p := node.adopted[0]
	dir := filepath.Join(dataB, "sandboxes", "sbx1")
	if p.ID != "sbx1" || p.Gen != 4 || p.Dir != dir || p.Snapshot != filepath.Join(dir, "snapshot-4") ||
		p.RootfsImage != filepath.Join(dir, "rootfs-4.json") {
		t.Fatalf("placed as %+v", p)
	}
	var got map[string]any
	if err := json.Unmarshal(p.Record, &got); err != nil || got["id"] != "sbx1" || got["metadata"].(map[string]any)["k"] != "v" {
		t.Fatalf("record %s (%v)", p.Record, err)
	}
	for file, want := range map[string]string{vmm.SnapshotStateFile: "vm state", vmm.SnapshotConfigFile: `{"machine":"a"}`, "relocated": "/boot/of/b"} {
		if b, err := os.ReadFile(filepath.Join(p.Snapshot, file)); err != nil || string(b) != want {
			t.Errorf("%s: %q %v, want %q", file, b, err, want)
		}
	}
	mem, err := snapshot.ReadMemoryManifest(p.Snapshot)
	if err != nil || len(mem.Layers) != 1 {
		t.Fatalf("memory manifest %+v, %v", mem, err)
	}
	if b, err := os.ReadFile(mem.Layers[0]); err != nil || string(b) != "guest memory" {
		t.Errorf("memory layer %q, %v", b, err)
	}
	layers, err := snapshot.LayersOf(p.RootfsImage)
	if err != nil || len(layers) != 2 {
		t.Fatalf("rootfs layers %v, %v", layers, err)
	}
	for i, want := range []string{"base layer", "own layer"} {
		if b, err := os.ReadFile(layers[i]); err != nil || !bytes.Equal(b, []byte(want)) {
			t.Errorf("rootfs layer %d: %q %v, want %q", i, b, err, want)
		}
	}
	if len(node.later) != 1 || node.later[0] != p.RootfsImage {
		t.Errorf("fetch later %v, want the rootfs config", node.later)
	}
	if err := rb.ImportPaused(ctx, "sbx1"); err != nil || len(node.adopted) != 1 {
		t.Fatalf("bringing a held sandbox again: %v, %d adopted", err, len(node.adopted))
	}
}

// TestPauseCarriesWorkingSet: a pause with a layered memory image and a
// working set is committed with the pack of that working set (the pages'
// bytes, read from its layers), and a node that reads the stack lazily
// keeps the pack and the working set it carries next to the snapshot. A
// working set that does not describe the stack commits no pack, and the
// import keeps none.
func TestPauseCarriesWorkingSet(t *testing.T) {
	for _, tc := range []struct {
		name, ws string
		kept     bool
	}{
		{"valid", `{"size":1048576,"extents":[{"off":4096,"len":8192},{"off":65536,"len":4096}]}`, true},
		{"outside its file", `{"size":4096,"extents":[{"off":4096,"len":8192}]}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap, memory := bringLayeredPause(t, tc.ws)
			f, pack, err := memsnap.ReadPackFile(filepath.Join(snap, snapshot.WorkingSetPackFile))
			if !tc.kept {
				if err == nil {
					f.Close()
				}
				if _, errWS := os.Stat(filepath.Join(snap, snapshot.WorkingSetFile)); !errors.Is(err, memsnap.ErrNoWorkingSet) || errWS == nil {
					t.Fatalf("a working set that does not fit its stack: pack %v, working set file %v; want neither", err, errWS)
				}
				return
			}
			if err != nil {
				t.Fatalf("the pack here: %v", err)
			}
			defer f.Close()
			if pack.Size != int64(len(memory)) || len(pack.Extents) != 2 {
				t.Fatalf("pack of a %d-byte file with %d extents, want %d and 2", pack.Size, len(pack.Extents), len(memory))
			}
			off := pack.DataOff
			for _, e := range pack.Extents {
				got := make([]byte, e.Len)
				if _, err := f.ReadAt(got, off); err != nil || !bytes.Equal(got, memory[e.Off:e.Off+e.Len]) {
					t.Fatalf("pack bytes of extent %d+%d differ from the layer's (%v)", e.Off, e.Len, err)
				}
				off += e.Len
			}
			if got, err := memsnap.ReadWorkingSet(filepath.Join(snap, snapshot.WorkingSetFile), pack.Size); err != nil || len(got) != 2 {
				t.Fatalf("working set here: %v, %v; want the pack's two extents", got, err)
			}
		})
	}
}

// bringLayeredPause commits a pause whose memory is one 1 MiB layer, with
// working set ws, and brings it on another node that reads memory lazily;
// it returns the snapshot directory there and the memory's bytes.
func bringLayeredPause(t *testing.T, ws string) (string, []byte) {
	ctx := context.Background()
	const size = 1 << 20
	memory := bytes.Repeat([]byte("guest page"), size/10+1)[:size]
	shared := t.TempDir()
	commitPauseWith(t, shared, ws, func(vm string) {
		layer := filepath.Join(vm, "mem-1.lsmt")
		f, err := os.Create(layer)
		if err != nil {
			t.Fatal(err)
		}
		xw, err := lsmt.NewExtentWriter(f, lsmt.SealOptions{VirtualSize: size})
		if err == nil {
			err = xw.WriteData(0, memory)
		}
		if err == nil {
			_, err = xw.Close()
		}
		if err == nil {
			err = f.Close()
		}
		if err == nil {
			err = snapshot.WriteMemoryManifest(vm, snapshot.MemoryImage{Layers: []string{layer}, File: filepath.Join(vm, snapshot.FlatMemory)})
		}
		if err != nil {
			t.Fatal(err)
		}
	})
	b := repoNode(t, shared)
	sctx, stop := context.WithCancel(ctx)
	t.Cleanup(stop)
	go func() { _ = b.ServeLayers(sctx, filepath.Join(t.TempDir(), "layers.sock")) }()
	for deadline := time.Now().Add(10 * time.Second); b.LazyURL(repo.Layer{}, repo.UseMemory) == "" && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	node := &bringer{tmpl: &template.Template{ID: "tpl", Snapshot: "/boot/of/b"}}
	rb := New(Options{Remote: b, DataDir: t.TempDir(), LazyMemory: true, Driver: relocator{}, Logger: slog.New(slog.DiscardHandler)}, node)
	if err := rb.ImportPaused(ctx, "sbx1"); err != nil || len(node.adopted) != 1 {
		t.Fatalf("bring: %v (%d adopted)", err, len(node.adopted))
	}
	snap := node.adopted[0].Snapshot
	if mem, err := snapshot.ReadMemoryManifest(snap); err != nil || len(mem.Layers) != 1 || !blob.IsURL(mem.Layers[0]) {
		t.Fatalf("memory manifest %+v, %v: want the layer socket's URL", mem, err)
	}
	return snap, memory
}
