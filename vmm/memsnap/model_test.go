package memsnap

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"pgregory.net/rapid"

	"github.com/agentenv/agentenv/storage/lsmt"
)

// TestStackModel checks Materialize, MaterializeOnto and Merge against a
// page model on random stacks: each layer maps random pages as data (random
// bytes, sometimes all zero), as zeroed extents, or not at all. Layers of
// one memory chain have one size (the guest's RAM); stacks of mixed sizes
// are checked with Materialize only, as MaterializeOnto and Merge flatten
// part of a stack at that part's top size.
func TestStackModel(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := context.Background()
	run := 0
	rapid.Check(t, func(t *rapid.T) {
		run++
		nl := rapid.IntRange(1, 4).Draw(t, "layers")
		sameSize := rapid.Bool().Draw(t, "sameSize")
		size := rapid.Int64Range(1, 24).Draw(t, "pages")
		var paths []string
		full := make([]byte, 24*ps) // every layer's mappings, sizes aside
		var model []byte
		for li := range nl {
			pages := size
			if !sameSize {
				pages = rapid.Int64Range(1, 24).Draw(t, fmt.Sprintf("pages%d", li))
			}
			p := filepath.Join(dir, fmt.Sprintf("r%d-l%d", run, li))
			f, err := os.Create(p)
			if err != nil {
				t.Fatal(err)
			}
			xw, err := lsmt.NewExtentWriter(f, lsmt.SealOptions{VirtualSize: uint64(pages * ps)})
			if err != nil {
				t.Fatal(err)
			}
			for pg := int64(0); pg < pages; pg++ {
				switch rapid.IntRange(0, 3).Draw(t, "kind") {
				case 1: // data
					b := bytes.Repeat([]byte{byte(rapid.IntRange(0, 255).Draw(t, "byte"))}, int(ps))
					b[rapid.IntRange(0, int(ps)-1).Draw(t, "pos")] = byte(rapid.IntRange(0, 255).Draw(t, "poke"))
					err = xw.WriteData(pg*ps, b)
					copy(full[pg*ps:], b)
				case 2: // zeroed
					err = xw.WriteZeroed(pg*ps, ps)
					clear(full[pg*ps : (pg+1)*ps])
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if _, err := xw.Close(); err != nil {
				t.Fatal(err)
			}
			f.Close()
			paths = append(paths, p)
			model = full[:pages*ps] // the stack is as large as its top layer
		}
		out := filepath.Join(dir, fmt.Sprintf("r%d-flat", run))
		if err := Materialize(ctx, paths, out); err != nil {
			t.Fatal(err)
		}
		if got := readFile(t, out); !bytes.Equal(got, model) {
			t.Fatalf("Materialize differs from the model at %s", firstDiff(got, model))
		}
		if !sameSize {
			return
		}
		k := rapid.IntRange(1, nl).Draw(t, "split")
		if k < nl {
			lower := filepath.Join(dir, fmt.Sprintf("r%d-lower", run))
			if err := Materialize(ctx, paths[:k], lower); err != nil {
				t.Fatal(err)
			}
			onto := filepath.Join(dir, fmt.Sprintf("r%d-onto", run))
			if err := MaterializeOnto(ctx, lower, paths[k:], onto); err != nil {
				t.Fatal(err)
			}
			if got := readFile(t, onto); !bytes.Equal(got, model) {
				t.Fatalf("MaterializeOnto(split %d) differs from the model at %s", k, firstDiff(got, model))
			}
		}
		from := rapid.IntRange(0, nl-1).Draw(t, "mergeFrom")
		to := rapid.IntRange(from+1, nl).Draw(t, "mergeTo")
		merged := filepath.Join(dir, fmt.Sprintf("r%d-merged", run))
		if _, err := Merge(ctx, paths[from:to], merged, ""); err != nil {
			t.Fatal(err)
		}
		stack := append(append(append([]string{}, paths[:from]...), merged), paths[to:]...)
		mflat := filepath.Join(dir, fmt.Sprintf("r%d-mflat", run))
		if err := Materialize(ctx, stack, mflat); err != nil {
			t.Fatal(err)
		}
		if got := readFile(t, mflat); !bytes.Equal(got, model) {
			t.Fatalf("stack with layers [%d,%d) merged differs from the model at %s", from, to, firstDiff(got, model))
		}
	})
}
