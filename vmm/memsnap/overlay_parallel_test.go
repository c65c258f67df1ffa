package memsnap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/storage/zfile"
	"github.com/agentenv/agentenv/vmm/memsnap/memsnaptest"
)

// span returns the pages [from, to).
func span(from, to int64) []int64 {
	out := make([]int64, 0, to-from)
	for p := from; p < to; p++ {
		out = append(out, p)
	}
	return out
}

// TestWriteLayersWorkers: a stack of several layers over many windows,
// written by all workers into a mapping split into two regions, reads as
// the flattened stack, whether the layers are mapped (plain files) or read
// through a decompressor (ZFiles). The stack has data and zeroed runs that
// cross window boundaries (where two workers share a run) and the region
// boundary, zeroed pages over the bottom file's data and over its holes,
// and pages rewritten and zeroed again by later layers.
func TestWriteLayersWorkers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	win := readBatch / ps // pages per window
	n := 4*win + 37       // the last window is a partial one
	split := win + win/2 + 3
	var data []int64
	for p := range n {
		if p%7 != 0 {
			data = append(data, p)
		}
	}
	boot := filepath.Join(dir, "boot")
	writeMemFile(t, boot, n, 11, data)
	layers := []string{filepath.Join(dir, "l0.lsmt")}
	if _, err := ImportFull(ctx, boot, layers[0], "boot"); err != nil {
		t.Fatal(err)
	}
	rounds := []memsnaptest.Spec{
		{Writes: append(append(span(win-40, win+60), span(split-5, split+9)...), 3, 9, 3*win+1, n-1),
			Zeros: append(span(2*win-3, 2*win+4), 14, 15, 16)}, // 14 over a hole, 15 and 16 over data
		{Writes: append(span(2*win-1, 2*win+2), 14, 15, win+1),
			Zeros: append(span(win-10, win+10), split-1, split, 3, n-2)},
		{Writes: append(span(3*win-200, 3*win+200), 2*win, split),
			Zeros: span(split-3, split+2)},
	}
	for i, spec := range rounds {
		cur := filepath.Join(dir, fmt.Sprintf("mem%d", i))
		if err := Materialize(ctx, layers, cur); err != nil {
			t.Fatal(err)
		}
		spec.File, spec.Seed = cur, uint64(500+i)
		layers = append(layers, captureRound(t, spec, layers[len(layers)-1], filepath.Join(dir, fmt.Sprintf("l%d.lsmt", i+1))))
	}
	flat := filepath.Join(dir, "flat")
	if err := Materialize(ctx, layers, flat); err != nil {
		t.Fatal(err)
	}
	want := readFile(t, flat)
	zipped := make([]string, 0, len(layers)-1)
	for _, l := range layers[1:] {
		zipped = append(zipped, compressLayer(t, l))
	}
	for name, above := range map[string][]string{"mapped": layers[1:], "read": zipped} {
		over := startHelper(t, memsnaptest.Spec{File: boot, Split: split * ps})
		st, err := WriteLayers(ctx, over.Pid, boot, above)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		mem, err := over.Memory()
		if err != nil {
			t.Fatal(err)
		}
		over.Stop()
		if !bytes.Equal(mem, want) {
			t.Fatalf("%s: mapping with %d layers written in differs from the flattened stack at %s", name, len(above), firstDiff(mem, want))
		}
		if st.Pages == 0 || st.ZeroPages == 0 {
			t.Errorf("%s: wrote %d data and %d zero pages, want some of each", name, st.Pages, st.ZeroPages)
		}
	}
}

// captureRound runs a helper as spec says and captures its diff against
// spec.File into out, on top of the layer parent; it returns out.
func captureRound(t *testing.T, spec memsnaptest.Spec, parent, out string) string {
	t.Helper()
	proc := startHelper(t, spec)
	uuid, err := LayerUUID(parent)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := CaptureDiff(context.Background(), proc.Pid, spec.File, out, uuid, ""); err != nil {
		t.Fatal(err)
	}
	proc.Stop()
	return out
}

// compressLayer writes layer as a ZFile next to it and returns its path.
func compressLayer(t *testing.T, layer string) string {
	t.Helper()
	src, err := os.Open(layer)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	out := layer + ".zfile"
	dst, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	defer dst.Close()
	if _, err := zfile.Compress(context.Background(), dst, src, zfile.Options{}); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestWriteLayersCanceled: a canceled context stops the workers and is
// the error.
func TestWriteLayersCanceled(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	win := readBatch / ps
	boot := filepath.Join(dir, "boot")
	writeMemFile(t, boot, 2*win, 3, span(0, 2*win))
	base := filepath.Join(dir, "l0.lsmt")
	if _, err := ImportFull(context.Background(), boot, base, "boot"); err != nil {
		t.Fatal(err)
	}
	diff := captureRound(t, memsnaptest.Spec{File: boot, Seed: 4, Writes: span(0, 2*win)}, base, filepath.Join(dir, "l1.lsmt"))
	over := startHelper(t, memsnaptest.Spec{File: boot})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := WriteLayers(ctx, over.Pid, boot, []string{diff}); !errors.Is(err, context.Canceled) {
		t.Fatalf("WriteLayers with a canceled context: %v, want context.Canceled", err)
	}
}
