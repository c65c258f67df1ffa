package memsnap

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/storage/lsmt"
	"github.com/agentenv/agentenv/vmm/memsnap"
	"github.com/agentenv/agentenv/vmm/memsnap/memsnaptest"
)

// The guest RAM of the benchmark: a 64 MiB memory file, fully populated and
// in the page cache, mapped privately by a helper process that dirties a
// share of its pages.
const memSize = 64 << 20

const repeats = 7 // each timing is the median of this many runs

func TestMain(m *testing.M) {
	memsnaptest.Main()
	os.Exit(m.Run())
}

// dirtyPages picks pct% of the pages, scattered (runs of mixed lengths as a
// guest leaves them), or all pages at 100%.
func dirtyPages(pages int64, pct int) []int64 {
	var out []int64
	for p := range pages {
		h := uint64(p)*0x9e3779b97f4a7c15 ^ uint64(p)>>3*0xbf58476d1ce4e5b9
		if int((h>>32)%100) < pct {
			out = append(out, p)
		}
	}
	return out
}

func median(d []time.Duration) time.Duration {
	d = slices.Clone(d)
	slices.Sort(d)
	return d[len(d)/2]
}

func mbps(bytes int64, d time.Duration) float64 { return float64(bytes) / (1 << 20) / d.Seconds() }

// writeFile writes n bytes of page patterns, synced and read back once so
// they are in the page cache.
func writeFile(b *testing.B, path string, n int64, seed uint64) {
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	pg := make([]byte, memsnaptest.PageSize)
	buf := make([]byte, 0, 1<<20)
	for p := int64(0); p*int64(len(pg)) < n; p++ {
		memsnaptest.Pattern(pg, seed, p)
		buf = append(buf, pg...)
		if len(buf) == cap(buf) {
			if _, err := f.Write(buf); err != nil {
				b.Fatal(err)
			}
			buf = buf[:0]
		}
	}
	if _, err := f.Write(buf); err != nil {
		b.Fatal(err)
	}
	// Synced, so its writeback does not land inside a timed run.
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		b.Fatal(err)
	}
	io.Copy(io.Discard, f)
}

// preadCopy copies src to dst with 1 MiB pread/write and fsyncs dst: the
// floor for moving the same bytes through a file.
func preadCopy(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer out.Close()
	buf := make([]byte, 1<<20)
	for off := int64(0); ; {
		n, err := in.ReadAt(buf, off)
		if n > 0 {
			if _, werr := out.Write(buf[:n]); werr != nil {
				return werr
			}
			off += int64(n)
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
	}
	return out.Sync()
}

// cpSync runs cp and then fsyncs the copy (CaptureDiff syncs its layer too).
func cpSync(src, dst string) error {
	if out, err := exec.Command("cp", src, dst).CombinedOutput(); err != nil {
		return fmt.Errorf("cp: %v: %s", err, out)
	}
	f, err := os.OpenFile(dst, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// cpuTime is the CPU time (user + system) used so far by this process and
// its reaped children (cp).
func cpuTime() time.Duration {
	var self, kids syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &self)
	syscall.Getrusage(syscall.RUSAGE_CHILDREN, &kids)
	tv := func(t syscall.Timeval) time.Duration { return time.Duration(t.Nano()) }
	return tv(self.Utime) + tv(self.Stime) + tv(kids.Utime) + tv(kids.Stime)
}

// timing is the median wall time and CPU time of one contender. The machine
// is shared, so wall time includes waiting for other engineers' work; CPU
// time is the steadier measure of our own cost.
type timing struct{ wall, cpu time.Duration }

// timeAll runs each contender once per round, interleaved so that drift in
// the machine's load hits all alike, and returns each one's medians. Each
// run's output is removed after it.
func timeAll(b *testing.B, dir string, fs ...func(out string) error) []timing {
	wall := make([][]time.Duration, len(fs))
	cpu := make([][]time.Duration, len(fs))
	for round := range repeats {
		for k, f := range fs {
			out := filepath.Join(dir, fmt.Sprintf("out-%d-%d", k, round))
			c0, start := cpuTime(), time.Now()
			if err := f(out); err != nil {
				b.Fatal(err)
			}
			wall[k] = append(wall[k], time.Since(start))
			cpu[k] = append(cpu[k], cpuTime()-c0)
			os.Remove(out)
		}
	}
	med := make([]timing, len(fs))
	for k := range fs {
		med[k] = timing{median(wall[k]), median(cpu[k])}
	}
	return med
}

// targets are where outputs go: the temporary directory's disk filesystem
// (fsync costs real I/O) and tmpfs (the CPU path alone).
func targets(b *testing.B) []struct{ name, dir string } {
	t := []struct{ name, dir string }{{"disk", b.TempDir()}}
	if d, err := os.MkdirTemp("/dev/shm", "memsnap-bench-"); err == nil {
		b.Cleanup(func() { os.RemoveAll(d) })
		t = append(t, struct{ name, dir string }{"tmpfs", d})
	}
	return t
}

// BenchmarkCaptureDiff: CaptureDiff of a 64 MiB private mapping with 10%, 50%
// and 100% of its pages dirtied, against cp and a pread/write copy of a file
// as large as the dirty pages (same filesystem, both fsynced). Ratio is
// ours/reference in MB/s of dirty data (higher is better; 1.0 = as fast as a copy).
func BenchmarkCaptureDiff(b *testing.B) {
	if _, err := exec.LookPath("cp"); err != nil {
		b.Skip("cp not installed")
	}
	ctx := context.Background()
	dir := b.TempDir()
	memFile := filepath.Join(dir, "mem")
	writeFile(b, memFile, memSize, 1)
	pages := int64(memSize / memsnaptest.PageSize)
	for _, pct := range []int{10, 50, 100} {
		b.Run(fmt.Sprintf("dirty=%d%%", pct), func(b *testing.B) {
			dirty := dirtyPages(pages, pct)
			proc, err := memsnaptest.Start(ctx, memsnaptest.Spec{File: memFile, Seed: 2, Writes: dirty})
			if err != nil {
				b.Fatal(err)
			}
			defer proc.Stop()
			dirtyBytes := int64(len(dirty)) * int64(memsnaptest.PageSize)
			ref := filepath.Join(dir, "ref.src")
			writeFile(b, ref, dirtyBytes, 3)
			b.ResetTimer()
			for range b.N {
				for _, tg := range targets(b) {
					var st memsnap.Stats
					d := timeAll(b, tg.dir,
						func(out string) error {
							var err error
							st, err = memsnap.CaptureDiff(ctx, proc.Pid, memFile, out, lsmt.UUID{}, "")
							return err
						},
						func(out string) error { return cpSync(ref, out) },
						func(out string) error { return preadCopy(ref, out) })
					if st.Pages != int64(len(dirty)) {
						b.Fatalf("captured %d pages, dirtied %d", st.Pages, len(dirty))
					}
					fmt.Printf("capture %3d%% dirty (%4.1f MiB, %4d runs) to %-5s: wall memsnap %v, cp %v, pread/write %v; cpu memsnap %v, cp %v, pread/write %v\n",
						pct, float64(dirtyBytes)/(1<<20), runs(dirty), tg.name, ms(d[0].wall), ms(d[1].wall), ms(d[2].wall), ms(d[0].cpu), ms(d[1].cpu), ms(d[2].cpu))
					fmt.Printf("    memsnap %.0f MB/s of dirty pages; ratio (reference time / ours, >1 = we are faster): wall vs cp %.2f, vs pread/write %.2f; cpu vs cp %.2f, vs pread/write %.2f\n",
						mbps(dirtyBytes, d[0].wall), ratio(d[1].wall, d[0].wall), ratio(d[2].wall, d[0].wall), ratio(d[1].cpu, d[0].cpu), ratio(d[2].cpu, d[0].cpu))
					b.ReportMetric(mbps(dirtyBytes, d[0].wall), tg.name+"_MB/s")
					b.ReportMetric(ratio(d[1].wall, d[0].wall), tg.name+"_wall_ratio_vs_cp")
				}
			}
		})
	}
}

// BenchmarkMaterialize: flattening a full 64 MiB base layer plus a 50% diff
// into a sparse file (Materialize, and MaterializeOnto the flat base file),
// and importing the 64 MiB file as a base layer, against cp of a 64 MiB file
// (restore must produce a whole memory file either way).
func BenchmarkMaterialize(b *testing.B) {
	if _, err := exec.LookPath("cp"); err != nil {
		b.Skip("cp not installed")
	}
	ctx := context.Background()
	dir := b.TempDir()
	memFile := filepath.Join(dir, "mem")
	writeFile(b, memFile, memSize, 1)
	base := filepath.Join(dir, "base.lsmt")
	if _, err := memsnap.ImportFull(ctx, memFile, base, ""); err != nil {
		b.Fatal(err)
	}
	pages := int64(memSize / memsnaptest.PageSize)
	proc, err := memsnaptest.Start(ctx, memsnaptest.Spec{File: memFile, Seed: 2, Writes: dirtyPages(pages, 50)})
	if err != nil {
		b.Fatal(err)
	}
	diff := filepath.Join(dir, "diff.lsmt")
	if _, err := memsnap.CaptureDiff(ctx, proc.Pid, memFile, diff, lsmt.UUID{}, ""); err != nil {
		b.Fatal(err)
	}
	proc.Stop()
	b.ResetTimer()
	for range b.N {
		for _, tg := range targets(b) {
			d := timeAll(b, tg.dir,
				func(out string) error { return memsnap.Materialize(ctx, []string{base, diff}, out) },
				func(out string) error { _, err := memsnap.ImportFull(ctx, memFile, out, ""); return err },
				func(out string) error { return cpSync(memFile, out) },
				func(out string) error { return memsnap.MaterializeOnto(ctx, memFile, []string{diff}, out) })
			fmt.Printf("64 MiB to %-5s: wall materialize(base+50%% diff) %v, materialize onto the flat base %v, import full %v, cp %v; cpu materialize %v, onto %v, import %v, cp %v\n",
				tg.name, ms(d[0].wall), ms(d[3].wall), ms(d[1].wall), ms(d[2].wall), ms(d[0].cpu), ms(d[3].cpu), ms(d[1].cpu), ms(d[2].cpu))
			fmt.Printf("    ratio (cp time / ours, >1 = we are faster): materialize wall %.2f cpu %.2f; onto wall %.2f cpu %.2f; import wall %.2f cpu %.2f\n",
				ratio(d[2].wall, d[0].wall), ratio(d[2].cpu, d[0].cpu), ratio(d[2].wall, d[3].wall), ratio(d[2].cpu, d[3].cpu),
				ratio(d[2].wall, d[1].wall), ratio(d[2].cpu, d[1].cpu))
			b.ReportMetric(ratio(d[2].wall, d[0].wall), tg.name+"_materialize_wall_ratio_vs_cp")
		}
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d)/1e6) }

func ratio(ref, ours time.Duration) float64 { return ref.Seconds() / max(ours.Seconds(), 1e-9) }

func runs(pages []int64) int {
	n := 0
	for i, p := range pages {
		if i == 0 || pages[i-1] != p-1 {
			n++
		}
	}
	return n
}
