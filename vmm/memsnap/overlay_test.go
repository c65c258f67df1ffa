package memsnap

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/vmm/memsnap/memsnaptest"
)

// TestWriteLayers: a process that maps only the bottom file of a stack
// and gets the layers above written into its mapping reads the flattened
// stack; a diff it is captured with afterwards, stacked on those layers,
// is again its memory; zeroed pages over holes of the bottom file are not
// written (they read as zero already).
func TestWriteLayers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	const n = 64
	var data []int64
	for p := int64(0); p < n; p += 2 {
		data = append(data, p)
	}
	boot := filepath.Join(dir, "boot")
	model := writeMemFile(t, boot, n, 7, data)
	layers := []string{filepath.Join(dir, "l0.lsmt")}
	if _, err := ImportFull(ctx, boot, layers[0], "boot"); err != nil {
		t.Fatal(err)
	}
	rounds := []memsnaptest.Spec{
		{Writes: []int64{1, 2, 3, 40, 63}, Zeros: []int64{4, 5, 6}}, // 5 over a hole, 4 and 6 over data
		{Writes: []int64{5, 4}, Zeros: []int64{1, 2, 7, 9, 11}},     // zero what round 1 wrote, and holes
		{Writes: []int64{7, 11, 12}, Zeros: []int64{40}},
	}
	for i, spec := range rounds {
		cur := filepath.Join(dir, fmt.Sprintf("mem%d", i))
		if err := Materialize(ctx, layers, cur); err != nil {
			t.Fatal(err)
		}
		spec.File, spec.Seed = cur, uint64(300+i)
		proc := startHelper(t, spec)
		parent, err := LayerUUID(layers[len(layers)-1])
		if err != nil {
			t.Fatal(err)
		}
		diff := filepath.Join(dir, fmt.Sprintf("l%d.lsmt", i+1))
		if _, err := CaptureDiff(ctx, proc.Pid, cur, diff, parent, ""); err != nil {
			t.Fatal(err)
		}
		proc.Stop()
		model = apply(model, spec)
		layers = append(layers, diff)

		// The same memory without a flatten: the boot file, layers written in.
		over := startHelper(t, memsnaptest.Spec{File: boot})
		st, err := WriteLayers(ctx, over.Pid, boot, layers[1:])
		if err != nil {
			t.Fatal(err)
		}
		mem, err := over.Memory()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(mem, model) {
			t.Fatalf("round %d: mapping with %d layers written in differs from the stack at %s", i, len(layers)-1, firstDiff(mem, model))
		}
		t.Logf("round %d: wrote %d data and %d zero pages", i, st.Pages, st.ZeroPages)
		if st.Pages == 0 {
			t.Fatalf("round %d: no data pages written", i)
		}
		// Its own diff against the boot file, on top of the stack, is its memory.
		top, err := LayerUUID(layers[len(layers)-1])
		if err != nil {
			t.Fatal(err)
		}
		again := filepath.Join(dir, fmt.Sprintf("again%d.lsmt", i))
		if _, err := CaptureDiff(ctx, over.Pid, boot, again, top, ""); err != nil {
			t.Fatal(err)
		}
		over.Stop()
		flat := filepath.Join(dir, fmt.Sprintf("again%d.flat", i))
		if err := Materialize(ctx, append(append([]string{}, layers...), again), flat); err != nil {
			t.Fatal(err)
		}
		if got := readFile(t, flat); !bytes.Equal(got, model) {
			t.Fatalf("round %d: stack plus the overlaid process's diff differs at %s", i, firstDiff(got, model))
		}
	}
	// The stack's zeroed pages are 1, 2, 6, 9 and 40. Pages 2, 6 and 40 lie
	// over the boot file's data and must be written; page 9 is a zeroed run
	// of its own over a hole and must not be (page 1 is in a run with 2).
	over := startHelper(t, memsnaptest.Spec{File: boot})
	st, err := WriteLayers(ctx, over.Pid, boot, layers[1:])
	if err != nil {
		t.Fatal(err)
	}
	if st.ZeroPages < 3 || st.ZeroPages >= 5 {
		t.Errorf("zero pages written %d, want 3 or 4 (not the zeroed page over a hole)", st.ZeroPages)
	}
}
