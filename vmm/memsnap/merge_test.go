package memsnap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/agentenv/agentenv/vmm/memsnap/memsnaptest"
)

// TestMerge builds a chain base + 3 diffs from helper processes and merges
// it whole and in part; every merged stack must materialize to the same
// memory as the original chain.
func TestMerge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	const n = 32
	var data []int64
	for p := int64(0); p < n; p += 2 {
		data = append(data, p)
	}
	model := writeMemFile(t, filepath.Join(dir, "boot"), n, 1, data)
	layers := []string{filepath.Join(dir, "l0")}
	if _, err := ImportFull(ctx, filepath.Join(dir, "boot"), layers[0], ""); err != nil {
		t.Fatal(err)
	}
	rounds := []memsnaptest.Spec{
		{Writes: []int64{1, 3, 5}, Zeros: []int64{0, 2}},
		{Writes: []int64{0, 7}, Zeros: []int64{4, 5}}, // zero a page the previous diff wrote
		{Writes: []int64{2, 9}, Zeros: []int64{6}},
	}
	for i, spec := range rounds {
		cur := filepath.Join(dir, fmt.Sprintf("mem%d", i))
		if err := Materialize(ctx, layers, cur); err != nil {
			t.Fatal(err)
		}
		spec.File, spec.Seed = cur, uint64(10+i)
		proc := startHelper(t, spec)
		parent, err := LayerUUID(layers[len(layers)-1])
		if err != nil {
			t.Fatal(err)
		}
		diff := filepath.Join(dir, fmt.Sprintf("l%d", i+1))
		if _, err := CaptureDiff(ctx, proc.Pid, cur, diff, parent, ""); err != nil {
			t.Fatal(err)
		}
		proc.Stop()
		model = apply(model, spec)
		layers = append(layers, diff)
	}
	baseID, _ := LayerUUID(layers[0])
	cases := []struct {
		name       string
		from, to   int // merge layers[from:to]
		wantZeroed []int64
	}{
		{name: "whole chain", from: 0, to: 4, wantZeroed: []int64{4, 5, 6}},
		{name: "the diffs", from: 1, to: 4, wantZeroed: []int64{4, 5, 6}},  // zeros must still hide the base
		{name: "middle two", from: 1, to: 3, wantZeroed: []int64{2, 4, 5}}, // page 0 rewritten by l2
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(dir, "merged-"+tc.name)
			st, err := Merge(ctx, layers[tc.from:tc.to], out, "merged")
			if err != nil {
				t.Fatal(err)
			}
			noTemp(t, out)
			l, dataPages, zeroed := layerPages(t, out)
			if !slices.Equal(zeroed, tc.wantZeroed) || st.ZeroPages != int64(len(tc.wantZeroed)) || st.Pages != int64(len(dataPages)) {
				t.Errorf("zeroed pages %v (stats %+v), want %v", zeroed, st, tc.wantZeroed)
			}
			wantParent := baseID
			if tc.from == 0 {
				wantParent = [16]byte{}
			}
			if l.ParentUUID() != wantParent {
				t.Errorf("parent %s, want %s", l.ParentUUID(), wantParent)
			}
			stack := append(append(slices.Clone(layers[:tc.from]), out), layers[tc.to:]...)
			flat := filepath.Join(dir, "flat-"+tc.name)
			if err := Materialize(ctx, stack, flat); err != nil {
				t.Fatal(err)
			}
			if got := readFile(t, flat); !bytes.Equal(got, model) {
				t.Fatalf("merged stack differs from the chain at %s", firstDiff(got, model))
			}
		})
	}
	t.Run("errors", func(t *testing.T) {
		for name, in := range map[string][]string{"none": nil, "missing": {layers[0], filepath.Join(dir, "missing")}} {
			out := filepath.Join(dir, "bad-"+name)
			if _, err := Merge(ctx, in, out, ""); err == nil {
				t.Errorf("%s: Merge succeeded", name)
			}
			if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s: failed merge left %s", name, out)
			}
			noTemp(t, out)
		}
	})
}
