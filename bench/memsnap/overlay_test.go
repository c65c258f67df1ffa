package memsnap

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentenv/agentenv/storage/lsmt"
	"github.com/agentenv/agentenv/vmm/memsnap"
	"github.com/agentenv/agentenv/vmm/memsnap/memsnaptest"
)

// The guest RAM a resume maps: a 512 MiB memory file, fully populated and
// in the page cache, with a 256 MiB layer above it.
const (
	overlayMemSize   = 512 << 20
	overlayLayerSize = 256 << 20
)

// BenchmarkWriteLayers: WriteLayers of a 256 MiB layer into a fresh
// process's private mapping of a 512 MiB memory file (what a resume does
// before the guest's state loads), the layer's pages scattered over the
// file (half of its pages, with 1% of them zeroed over the file's data) or
// one dense run, against cp of a file as large as the layer's data into
// tmpfs (both from the page cache into memory; the layer is in the page
// cache too, as it is right after a pause). Ratio is cp time / ours (>1 =
// we are faster).
func BenchmarkWriteLayers(b *testing.B) {
	if _, err := exec.LookPath("cp"); err != nil {
		b.Skip("cp not installed")
	}
	shm, err := os.MkdirTemp("/dev/shm", "memsnap-bench-")
	if err != nil {
		b.Skip("no tmpfs at /dev/shm")
	}
	b.Cleanup(func() { os.RemoveAll(shm) })
	ctx := context.Background()
	dir := b.TempDir()
	memFile := filepath.Join(dir, "mem")
	writeFile(b, memFile, overlayMemSize, 1)
	pages := int64(overlayMemSize / memsnaptest.PageSize)
	dense := make([]int64, overlayLayerSize/memsnaptest.PageSize)
	for i := range dense {
		dense[i] = pages/4 + int64(i)
	}
	scattered := dirtyPages(pages, 50)
	cases := []struct {
		name         string
		writes, zero []int64
	}{
		{"scattered", scattered, everyNth(scattered, 100)},
		{"dense", dense, nil},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			layer := filepath.Join(dir, c.name+".lsmt")
			spec := memsnaptest.Spec{File: memFile, Seed: 2, Writes: c.writes, Zeros: c.zero}
			captured := captureLayer(ctx, b, spec, layer)
			ref := filepath.Join(dir, "ref.src")
			writeFile(b, ref, captured.Pages*int64(memsnaptest.PageSize), 3)
			b.ResetTimer()
			for range b.N {
				ours, cp := timeWriteLayers(ctx, b, memFile, layer, captured, ref, shm)
				mib := float64(captured.Pages*int64(memsnaptest.PageSize)) / (1 << 20)
				fmt.Printf("write layers %-9s (%5.1f MiB data, %4d zero pages, %6d runs): wall memsnap %v, cp %v; cpu memsnap %v, cp %v\n",
					c.name, mib, captured.ZeroPages, runs(c.writes), ms(ours.wall), ms(cp.wall), ms(ours.cpu), ms(cp.cpu))
				fmt.Printf("    memsnap %.0f MB/s; ratio (cp time / ours, >1 = we are faster): wall %.2f, cpu %.2f\n",
					mib/ours.wall.Seconds(), ratio(cp.wall, ours.wall), ratio(cp.cpu, ours.cpu))
				b.ReportMetric(ratio(cp.wall, ours.wall), "wall_ratio_vs_cp")
			}
		})
	}
}

// everyNth returns every nth element of s.
func everyNth(s []int64, n int) []int64 {
	var out []int64
	for i := 0; i < len(s); i += n {
		out = append(out, s[i])
	}
	return out
}

// captureLayer runs a helper as spec says and captures its diff into out.
func captureLayer(ctx context.Context, b *testing.B, spec memsnaptest.Spec, out string) memsnap.Stats {
	proc, err := memsnaptest.Start(ctx, spec)
	if err != nil {
		b.Fatal(err)
	}
	defer proc.Stop()
	st, err := memsnap.CaptureDiff(ctx, proc.Pid, spec.File, out, lsmt.UUID{}, "")
	if err != nil {
		b.Fatal(err)
	}
	return st
}

// timeWriteLayers times, interleaved round by round, WriteLayers of layer
// into a fresh helper's mapping of memFile (starting and stopping the
// helper is not timed) and cp of ref into dir, and returns their medians.
func timeWriteLayers(ctx context.Context, b *testing.B, memFile, layer string, want memsnap.Stats, ref, dir string) (ours, cp timing) {
	var wall, cpu [2][]time.Duration
	for round := range repeats {
		proc, err := memsnaptest.Start(ctx, memsnaptest.Spec{File: memFile})
		if err != nil {
			b.Fatal(err)
		}
		c0, start := cpuTime(), time.Now()
		st, err := memsnap.WriteLayers(ctx, proc.Pid, memFile, []string{layer})
		wall[0], cpu[0] = append(wall[0], time.Since(start)), append(cpu[0], cpuTime()-c0)
		proc.Stop()
		if err != nil {
			b.Fatal(err)
		}
		if st.Pages != want.Pages || st.ZeroPages != want.ZeroPages {
			b.Fatalf("wrote %d data and %d zero pages, the layer holds %d and %d", st.Pages, st.ZeroPages, want.Pages, want.ZeroPages)
		}
		out := filepath.Join(dir, fmt.Sprintf("cp-%d", round))
		c0, start = cpuTime(), time.Now()
		if err := cpSync(ref, out); err != nil {
			b.Fatal(err)
		}
		wall[1], cpu[1] = append(wall[1], time.Since(start)), append(cpu[1], cpuTime()-c0)
		os.Remove(out)
	}
	return timing{median(wall[0]), median(cpu[0])}, timing{median(wall[1]), median(cpu[1])}
}
