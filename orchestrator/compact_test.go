package orchestrator

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/telemetry"

	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/storage/lsmt"
	"github.com/agentenv/agentenv/store"
	"github.com/agentenv/agentenv/vmm/memsnap"
	"github.com/prometheus/client_golang/prometheus"
)

const compactSize = 1 << 20

// writeLayer seals a layer of compactSize on top of parent ("" for none)
// whose sector i*4096 holds fill (data) or zeros (a zeroed extent hiding
// lower data) at each offset given.
func writeLayer(t *testing.T, path, parent string, data map[int64]byte, zeroed []int64) {
	t.Helper()
	opt := lsmt.SealOptions{VirtualSize: compactSize, Message: filepath.Base(path)}
	if parent != "" {
		l, err := lsmt.OpenLayerFile(parent)
		if err != nil {
			t.Fatal(err)
		}
		opt.Parent = l.UUID()
		l.Close()
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	x, err := lsmt.NewExtentWriter(f, opt)
	if err != nil {
		t.Fatal(err)
	}
	for off := int64(0); off < compactSize; off += 4096 {
		if b, ok := data[off]; ok {
			if err := x.WriteData(off, bytes.Repeat([]byte{b}, 4096)); err != nil {
				t.Fatal(err)
			}
		}
		for _, z := range zeroed {
			if z == off {
				if err := x.WriteZeroed(off, 4096); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if _, err := x.Close(); err != nil {
		t.Fatal(err)
	}
}

// readStack reads a stack of layers flattened (as a VM would see it).
func readStack(t *testing.T, layers []string) []byte {
	t.Helper()
	flat := filepath.Join(t.TempDir(), "flat")
	if err := memsnap.Materialize(context.Background(), layers, flat); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(flat)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != compactSize {
		t.Fatalf("%v flattened to %d bytes, want %d", layers, len(b), compactSize)
	}
	return b
}

// TestCompactMergesOwnLayers: a paused sandbox whose chains exceed the limit
// gets its own layers merged into one, shared layers below stay, zeroed
// extents still hide the base, and the disk and memory read the same.
func TestCompactMergesOwnLayers(t *testing.T) {
	dir := t.TempDir()
	st, err := store.Open(filepath.Join(dir, "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	o := &Orchestrator{cfg: Options{DataDir: dir, MaxLayers: 3}, store: st, log: slog.Default(),
		m: telemetry.NewOps(prometheus.NewRegistry()), sandboxes: map[string]*instance{}}
	o.catalog = o.newCatalog()
	o.journal = &sandbox.Journal{Store: st, Log: o.log}
	o.mem = newImages(o)
	tmpl, sbx := filepath.Join(dir, "templates", "t"), filepath.Join(dir, "sandboxes", "s")
	snap := filepath.Join(sbx, "snapshot-6")
	for _, d := range []string{tmpl, snap} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	chain := func(kind string) []string {
		base := filepath.Join(tmpl, kind+"-0.lsmt")
		writeLayer(t, base, "", map[int64]byte{0: 'b', 4096: 'b', 8192: 'b'}, nil)
		out := []string{base}
		for gen := 1; gen <= 5; gen++ {
			p := filepath.Join(sbx, fmt.Sprintf("%s-%d.lsmt", kind, gen))
			writeLayer(t, p, out[len(out)-1], map[int64]byte{int64(gen) * 4096 * 10: byte('0' + gen), 4096: byte('0' + gen)}, []int64{8192})
			out = append(out, p)
		}
		return out
	}
	mem, disk := chain("mem"), chain("rootfs")
	wantMem, wantDisk := readStack(t, mem), readStack(t, disk)
	if wantMem[8192] != 0 || wantMem[4096] != '5' || wantMem[0] != 'b' {
		t.Fatalf("test layers read wrong before the merge: %q %q %q", wantMem[0], wantMem[4096], wantMem[8192])
	}
	if err := snapshot.WriteMemoryManifest(snap, snapshot.MemoryImage{Layers: mem, File: filepath.Join(snap, snapshot.FlatMemory)}); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(sbx, "rootfs-5.json")
	if err := snapshot.WriteImageConfig(cfg, disk); err != nil {
		t.Fatal(err)
	}
	rec := sandbox.Record{ID: "s", State: sandbox.Paused, Dir: sbx, Snapshot: snap, RootfsImage: cfg, Gen: 6}
	o.sandboxes["s"] = &instance{rec: rec}
	if err := st.Put(store.Sandboxes, rec.ID, rec); err != nil {
		t.Fatal(err)
	}
	if err := o.compact(context.Background(), "s"); err != nil {
		t.Fatal(err)
	}
	m, err := snapshot.ReadMemoryManifest(snap)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := o.Get("s")
	layers := snapshot.Refs(got.RootfsImage)
	if len(m.Layers) != 2 || m.Layers[0] != mem[0] || len(layers) != 2 || layers[0] != disk[0] {
		t.Fatalf("after compaction: memory %v, rootfs %v; want the template base plus one merged layer each", m.Layers, layers)
	}
	if !bytes.Equal(readStack(t, m.Layers), wantMem) || !bytes.Equal(readStack(t, layers), wantDisk) {
		t.Fatal("merged stacks read differently from the original ones")
	}
	for _, p := range append(mem[1:], disk[1:]...) {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("merged-away layer %s is still there", p)
		}
	}
	var stored sandbox.Record
	if err := st.Get(store.Sandboxes, "s", &stored); err != nil || stored.RootfsImage != got.RootfsImage {
		t.Fatalf("stored record rootfs %q, want %q (%v)", stored.RootfsImage, got.RootfsImage, err)
	}
}
