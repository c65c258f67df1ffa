package memsnap

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/agentenv/agentenv/storage/lsmt"
	"github.com/agentenv/agentenv/vmm/memsnap/memsnaptest"
)

// TestImportFullKeepsHoles imports sparse memory files: holes and zero pages
// (allocated or not) are left out of the layer and out of the materialized file.
func TestImportFullKeepsHoles(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		size      int64   // bytes
		data      []int64 // pages with a pattern
		zeroAlloc []int64 // pages written with zeros (allocated, not holes)
	}{
		{"sparse", 256 * ps, []int64{3, 4, 100, 255}, []int64{10, 11}},
		{"all holes", 64 * ps, nil, nil},
		{"dense", 16 * ps, []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, nil},
		{"odd size tail", 8*ps + 1000, []int64{1, 8}, []int64{2}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			dir := t.TempDir()
			memFile := filepath.Join(dir, "mem")
			want := make([]byte, tc.size)
			f, err := os.Create(memFile)
			if err != nil {
				t.Fatal(err)
			}
			if err := f.Truncate(tc.size); err != nil {
				t.Fatal(err)
			}
			for _, p := range tc.data {
				pg := make([]byte, ps)
				memsnaptest.Pattern(pg, 5, p)
				pg = pg[:min(ps, tc.size-p*ps)]
				copy(want[p*ps:], pg)
				if _, err := f.WriteAt(pg, p*ps); err != nil {
					t.Fatal(err)
				}
			}
			for _, p := range tc.zeroAlloc {
				if _, err := f.WriteAt(make([]byte, ps), p*ps); err != nil {
					t.Fatal(err)
				}
			}
			f.Close()
			out := filepath.Join(dir, "base.lsmt")
			st, err := ImportFull(ctx, memFile, out, "boot")
			if err != nil {
				t.Fatal(err)
			}
			noTemp(t, out)
			if st.Pages != int64(len(tc.data)) || st.ZeroPages != 0 {
				t.Errorf("stats %+v, want %d pages and no zero pages", st, len(tc.data))
			}
			l, err := lsmt.OpenLayerFile(out)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			vs := (tc.size + 511) / 512 * 512
			if l.VirtualSize() != vs || !l.ParentUUID().IsNil() || l.UUID().IsNil() {
				t.Errorf("layer size %d parent %s uuid %s; want size %d, nil parent, an uuid", l.VirtualSize(), l.ParentUUID(), l.UUID(), vs)
			}
			var mapped []int64
			spp := uint64(ps / lsmt.SectorSize)
			for _, s := range l.Index().Segments() {
				if s.Zeroed {
					t.Errorf("base layer has a zeroed mapping %+v", s)
				}
				for p := s.Offset / spp; p*spp < s.End(); p++ {
					mapped = append(mapped, int64(p))
				}
			}
			if !slices.Equal(mapped, sorted(tc.data)) {
				t.Errorf("mapped pages %v, want %v", mapped, sorted(tc.data))
			}
			flat := filepath.Join(dir, "flat")
			if err := Materialize(ctx, []string{out}, flat); err != nil {
				t.Fatal(err)
			}
			got := readFile(t, flat)
			want = append(want, make([]byte, vs-tc.size)...)
			if !bytes.Equal(got, want) {
				t.Fatalf("materialized import differs from the file at %s", firstDiff(got, want))
			}
			for p := int64(0); p*ps < tc.size; p++ {
				if isHole(t, flat, p) == slices.Contains(tc.data, p) {
					t.Errorf("page %d: hole=%v, want a hole exactly where the file had no data", p, isHole(t, flat, p))
				}
			}
		})
	}
}

func TestImportFullErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for name, src := range map[string]string{"empty": empty, "missing": filepath.Join(dir, "missing"), "directory": dir} {
		out := filepath.Join(dir, name+".lsmt")
		if _, err := ImportFull(context.Background(), src, out, ""); err == nil {
			t.Errorf("%s: ImportFull succeeded", name)
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("%s: a failed import left %s", name, out)
		}
		noTemp(t, out)
	}
}
