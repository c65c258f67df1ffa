package memsnap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/storage/lsmt"
	"github.com/agentenv/agentenv/vmm/memsnap/memsnaptest"
)

// TestCaptureDiff runs a helper that maps a memory file privately, writes
// some pages, zeroes others and only reads others, and checks that the diff
// holds exactly the written pages and that base+diff is the helper's memory.
func TestCaptureDiff(t *testing.T) {
	t.Parallel()
	for name, dir := range dirs(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			const n = 64
			var data []int64 // pages 0..39 hold data except 10..14; 40..63 are holes
			for p := int64(0); p < 40; p++ {
				if p < 10 || p > 14 {
					data = append(data, p)
				}
			}
			memFile := filepath.Join(dir, "mem")
			content := writeMemFile(t, memFile, n, 1, data)
			base := filepath.Join(dir, "base.lsmt")
			if _, err := ImportFull(ctx, memFile, base, "base"); err != nil {
				t.Fatal(err)
			}
			spec := memsnaptest.Spec{File: memFile, Seed: 2,
				Reads:  []int64{8, 9, 11, 30, 50},        // 30 is read, then written
				Writes: []int64{1, 2, 3, 20, 30, 41, 63}, // a run, single pages, a hole page, the last page
				Zeros:  []int64{5, 6, 45}}                // data pages zeroed, and a hole page zeroed
			proc := startHelper(t, spec)
			diff := filepath.Join(dir, "diff.lsmt")
			baseID, err := LayerUUID(base)
			if err != nil {
				t.Fatal(err)
			}
			st, err := CaptureDiff(ctx, proc.Pid, memFile, diff, baseID, "pause 1")
			if err != nil {
				t.Fatal(err)
			}
			noTemp(t, diff)
			if st.Pages != int64(len(spec.Writes)) || st.ZeroPages != int64(len(spec.Zeros)) {
				t.Errorf("stats %+v: want %d pages and %d zero pages", st, len(spec.Writes), len(spec.Zeros))
			}
			if fi, err := os.Stat(diff); err != nil || fi.Size() != st.Bytes {
				t.Errorf("stats say %d bytes, file: %v %v", st.Bytes, fi, err)
			}
			l, dataPages, zeroPages := layerPages(t, diff)
			if !slices.Equal(dataPages, sorted(spec.Writes)) {
				t.Errorf("data pages in the layer %v, want the written pages %v", dataPages, sorted(spec.Writes))
			}
			if !slices.Equal(zeroPages, sorted(spec.Zeros)) {
				t.Errorf("zeroed pages in the layer %v, want %v", zeroPages, sorted(spec.Zeros))
			}
			if l.ParentUUID() != baseID || l.VirtualSize() != n*ps || l.Trailer.Tag != "pause 1" {
				t.Errorf("layer parent %s size %d tag %q; want parent %s size %d", l.ParentUUID(), l.VirtualSize(), l.Trailer.Tag, baseID, n*ps)
			}

			flat := filepath.Join(dir, "flat")
			if err := Materialize(ctx, []string{base, diff}, flat); err != nil {
				t.Fatal(err)
			}
			noTemp(t, flat)
			for _, p := range []string{diff, flat} {
				if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
					t.Errorf("%s: mode %v (%v), want 0600: guest memory is private", p, fi.Mode(), err)
				}
			}
			mem, err := proc.Memory()
			if err != nil {
				t.Fatal(err)
			}
			got := readFile(t, flat)
			if want := apply(content, spec); !bytes.Equal(mem, want) {
				t.Fatalf("helper memory differs from the model at %s", firstDiff(mem, want))
			}
			if !bytes.Equal(got, mem) {
				t.Fatalf("materialized base+diff differs from the helper's memory at %s", firstDiff(got, mem))
			}
			for _, p := range []int64{5, 6, 12, 45, 50} {
				if !isHole(t, flat, p) {
					t.Errorf("page %d of the materialized file is not a hole", p)
				}
			}
		})
	}
}

// TestCapturePartialMapping maps the middle of a memory file: the layer's
// offsets are file offsets and its virtual size still covers the whole file.
func TestCapturePartialMapping(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	const n = 64
	all := make([]int64, n)
	for i := range all {
		all[i] = int64(i)
	}
	memFile := filepath.Join(dir, "mem")
	content := writeMemFile(t, memFile, n, 1, all)
	base := filepath.Join(dir, "base.lsmt")
	if _, err := ImportFull(ctx, memFile, base, ""); err != nil {
		t.Fatal(err)
	}
	spec := memsnaptest.Spec{File: memFile, Offset: 16 * ps, Size: 32 * ps, Seed: 3, Writes: []int64{0, 5}, Zeros: []int64{31}}
	proc := startHelper(t, spec)
	diff := filepath.Join(dir, "diff.lsmt")
	if _, err := CaptureDiff(ctx, proc.Pid, memFile, diff, lsmt.UUID{}, ""); err != nil {
		t.Fatal(err)
	}
	l, data, zeroed := layerPages(t, diff)
	if !slices.Equal(data, []int64{16, 21}) || !slices.Equal(zeroed, []int64{47}) || l.VirtualSize() != n*ps {
		t.Fatalf("layer: data pages %v zeroed %v size %d; want [16 21], [47], %d", data, zeroed, l.VirtualSize(), n*ps)
	}
	mem, err := proc.Memory()
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Clone(content)
	copy(want[16*ps:48*ps], mem)
	flat := filepath.Join(dir, "flat")
	if err := Materialize(ctx, []string{base, diff}, flat); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, flat); !bytes.Equal(got, want) {
		t.Fatalf("materialized file differs at %s", firstDiff(got, want))
	}
}

// TestCaptureSplitRegions: a VMM that maps its memory file as two regions
// (addresses in the reverse of file order) gets both captured.
func TestCaptureSplitRegions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	const n = 64
	all := make([]int64, n)
	for i := range all {
		all[i] = int64(i)
	}
	memFile := filepath.Join(dir, "mem")
	content := writeMemFile(t, memFile, n, 1, all)
	base := filepath.Join(dir, "base.lsmt")
	if _, err := ImportFull(ctx, memFile, base, ""); err != nil {
		t.Fatal(err)
	}
	spec := memsnaptest.Spec{File: memFile, Split: 24 * ps, Seed: 4, Writes: []int64{1, 23, 24, 40, 63}, Zeros: []int64{5, 30}, Reads: []int64{22, 25}}
	proc := startHelper(t, spec)
	regions, err := FindRegions(proc.Pid, memFile)
	if err != nil {
		t.Fatal(err)
	}
	if len(regions) != 2 || regions[0].FileOffset != 0 || regions[1].FileOffset != uint64(24*ps) || regions[0].Start < regions[1].Start {
		t.Fatalf("regions %+v: want two, in file order, mapped in reverse address order", regions)
	}
	if r, err := FindRegion(proc.Pid, memFile); err != nil || r != regions[1] {
		t.Fatalf("FindRegion = %+v, %v; want the larger region %+v", r, err, regions[1])
	}
	diff := filepath.Join(dir, "diff.lsmt")
	st, err := CaptureDiff(ctx, proc.Pid, memFile, diff, lsmt.UUID{}, "")
	if err != nil {
		t.Fatal(err)
	}
	_, data, zeroed := layerPages(t, diff)
	if !slices.Equal(data, spec.Writes) || !slices.Equal(zeroed, spec.Zeros) || st.Pages != 5 || st.ZeroPages != 2 {
		t.Fatalf("layer data %v zeroed %v (stats %+v); want %v and %v", data, zeroed, st, spec.Writes, spec.Zeros)
	}
	mem, err := proc.Memory()
	if err != nil {
		t.Fatal(err)
	}
	if want := apply(content, spec); !bytes.Equal(mem, want) {
		t.Fatalf("helper memory differs from the model at %s", firstDiff(mem, want))
	}
	flat := filepath.Join(dir, "flat")
	if err := Materialize(ctx, []string{base, diff}, flat); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, flat); !bytes.Equal(got, mem) {
		t.Fatalf("materialized file differs from the helper's memory at %s", firstDiff(got, mem))
	}
}

// TestCaptureBatching dirties more runs than one process_vm_readv takes
// (1024 iovecs) and a run longer than the read buffer.
func TestCaptureBatching(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	const n = 4096 // 16 MiB
	all := make([]int64, n)
	for i := range all {
		all[i] = int64(i)
	}
	memFile := filepath.Join(dir, "mem")
	content := writeMemFile(t, memFile, n, 7, all)
	spec := memsnaptest.Spec{File: memFile, Seed: 8}
	for p := int64(0); p < 3000; p += 2 {
		spec.Writes = append(spec.Writes, p)
	}
	for p := int64(1); p < 200; p += 2 {
		spec.Zeros = append(spec.Zeros, p)
	}
	for p := int64(3000); p < n; p++ {
		spec.Writes = append(spec.Writes, p)
	}
	proc := startHelper(t, spec)
	base := filepath.Join(dir, "base.lsmt")
	if _, err := ImportFull(ctx, memFile, base, ""); err != nil {
		t.Fatal(err)
	}
	diff := filepath.Join(dir, "diff.lsmt")
	st, err := CaptureDiff(ctx, proc.Pid, memFile, diff, lsmt.UUID{}, "")
	if err != nil {
		t.Fatal(err)
	}
	if st.Pages != int64(len(spec.Writes)) || st.ZeroPages != int64(len(spec.Zeros)) {
		t.Errorf("stats %+v: want %d pages and %d zero pages", st, len(spec.Writes), len(spec.Zeros))
	}
	flat := filepath.Join(dir, "flat")
	if err := Materialize(ctx, []string{base, diff}, flat); err != nil {
		t.Fatal(err)
	}
	if got, want := readFile(t, flat), apply(content, spec); !bytes.Equal(got, want) {
		t.Fatalf("materialized file differs from the helper's memory at %s", firstDiff(got, want))
	}
}

// TestStackOfDiffs restores three times from the materialized stack, each
// time capturing a diff on top, the way pause/resume cycles build a chain.
func TestStackOfDiffs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	const n = 32
	var data []int64
	for p := int64(0); p < n; p += 3 {
		data = append(data, p)
	}
	model := writeMemFile(t, filepath.Join(dir, "boot"), n, 100, data)
	layers := []string{filepath.Join(dir, "l0.lsmt")}
	if _, err := ImportFull(ctx, filepath.Join(dir, "boot"), layers[0], "boot"); err != nil {
		t.Fatal(err)
	}
	rounds := []memsnaptest.Spec{
		{Writes: []int64{0, 1, 2, 10, 31}, Zeros: []int64{3, 6}, Reads: []int64{9, 12}},
		{Writes: []int64{2, 3, 11}, Zeros: []int64{0, 10, 15}, Reads: []int64{1, 31}},  // zero what round 1 wrote
		{Writes: []int64{0, 10, 20}, Zeros: []int64{31, 2}, Reads: []int64{3, 11, 15}}, // rewrite what round 2 zeroed
	}
	for i, spec := range rounds {
		cur := filepath.Join(dir, fmt.Sprintf("mem%d", i))
		if err := Materialize(ctx, layers, cur); err != nil {
			t.Fatal(err)
		}
		if got := readFile(t, cur); !bytes.Equal(got, model) {
			t.Fatalf("round %d: materialized stack of %d differs from the model at %s", i, len(layers), firstDiff(got, model))
		}
		spec.File, spec.Seed = cur, uint64(200+i)
		proc := startHelper(t, spec)
		parent, err := LayerUUID(layers[len(layers)-1])
		if err != nil {
			t.Fatal(err)
		}
		diff := filepath.Join(dir, fmt.Sprintf("l%d.lsmt", i+1))
		st, err := CaptureDiff(ctx, proc.Pid, cur, diff, parent, "")
		if err != nil {
			t.Fatal(err)
		}
		if st.Pages != int64(len(spec.Writes)) || st.ZeroPages != int64(len(spec.Zeros)) {
			t.Errorf("round %d: stats %+v, want %d pages and %d zero pages", i, st, len(spec.Writes), len(spec.Zeros))
		}
		l, _, _ := layerPages(t, diff)
		if l.ParentUUID() != parent {
			t.Errorf("round %d: parent %s, want %s", i, l.ParentUUID(), parent)
		}
		model = apply(model, spec)
		mem, err := proc.Memory()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(mem, model) {
			t.Fatalf("round %d: helper memory differs from the model at %s", i, firstDiff(mem, model))
		}
		proc.Stop()
		layers = append(layers, diff)
	}
	final := filepath.Join(dir, "final")
	if err := Materialize(ctx, layers, final); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, final); !bytes.Equal(got, model) {
		t.Fatalf("stack of %d layers differs from the model at %s", len(layers), firstDiff(got, model))
	}
}

func TestCaptureErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	memFile := filepath.Join(dir, "mem")
	writeMemFile(t, memFile, 8, 1, []int64{0, 1})
	other := filepath.Join(dir, "other")
	writeMemFile(t, other, 8, 1, []int64{0})

	gone := startHelper(t, memsnaptest.Spec{File: memFile, Writes: []int64{1}})
	gone.Stop()
	shared := startHelper(t, memsnaptest.Spec{File: other, Shared: true, Writes: []int64{2}})
	private := startHelper(t, memsnaptest.Spec{File: memFile, Writes: []int64{3}})
	zombie := exec.Command("/bin/true")
	if err := zombie.Start(); err != nil {
		t.Fatal(err)
	}
	defer zombie.Wait()
	waitZombie(t, zombie.Process.Pid)

	cases := []struct {
		name    string
		pid     int
		file    string
		wantErr error
	}{
		{"process gone", gone.Pid, memFile, ErrProcessGone},
		{"zombie", zombie.Process.Pid, memFile, ErrProcessGone},
		{"file not mapped", private.Pid, other, ErrNotMapped},
		{"shared mapping", shared.Pid, other, ErrSharedMapping},
		{"memory file missing", private.Pid, filepath.Join(dir, "nope"), os.ErrNotExist},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_")+".lsmt")
			_, err := CaptureDiff(context.Background(), tc.pid, tc.file, out, lsmt.UUID{}, "")
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("CaptureDiff: %v, want %v", err, tc.wantErr)
			}
			if _, serr := os.Stat(out); !errors.Is(serr, os.ErrNotExist) {
				t.Errorf("a failed capture left %s (stat: %v)", out, serr)
			}
			noTemp(t, out)
		})
	}
	t.Run("canceled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		out := filepath.Join(dir, "canceled.lsmt")
		if _, err := CaptureDiff(ctx, private.Pid, memFile, out, lsmt.UUID{}, ""); !errors.Is(err, context.Canceled) {
			t.Fatalf("CaptureDiff: %v, want context.Canceled", err)
		}
		noTemp(t, out)
	})
}

func waitZombie(t *testing.T, pid int) {
	t.Helper()
	for range 500 {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatal(err)
		}
		if i := bytes.LastIndexByte(b, ')'); i > 0 && len(b) > i+2 && b[i+2] == 'Z' {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("pid %d did not become a zombie", pid)
}
