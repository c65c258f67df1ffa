package storage

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/storage/image"
)

// Run with: go test -run '^$' -bench . -benchtime 1x ./bench/storage
// AENV_BENCH_SIZE_MIB sets the virtual disk size (default 256).

var (
	fixOnce sync.Once
	fix     *Fixture
	fixErr  error
	fixDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if fixDir != "" {
		os.RemoveAll(fixDir)
	}
	os.Exit(code)
}

func fixture(b *testing.B) *Fixture {
	fixOnce.Do(func() {
		mib := int64(256)
		if v, err := strconv.ParseInt(os.Getenv("AENV_BENCH_SIZE_MIB"), 10, 64); err == nil && v > 0 {
			mib = v
		}
		fixDir, fixErr = os.MkdirTemp("", "aenv-bench-storage-")
		if fixErr != nil {
			return
		}
		start := time.Now()
		fix, fixErr = NewFixture(context.Background(), fixDir, mib<<20)
		if fixErr == nil {
			fmt.Printf("fixture: 4-layer stack of %d MiB built in %s\n", mib, time.Since(start).Round(time.Millisecond))
		}
	})
	if fixErr != nil {
		b.Fatal(fixErr)
	}
	return fix
}

// openAll opens the stack with mapped lowers (the default), the stack with
// pread lowers, and the flat raw file, and warms the page cache for all, so
// the comparison is CPU path against CPU path.
func openAll(b *testing.B, f *Fixture) (mapped, pread *image.Image, raw *os.File) {
	var err error
	if mapped, err = image.Open(context.Background(), f.Config, image.Options{}); err != nil {
		b.Fatal(err)
	}
	if pread, err = image.Open(context.Background(), f.Config, image.Options{NoMmap: true}); err != nil {
		b.Fatal(err)
	}
	if raw, err = os.Open(f.Raw); err != nil {
		b.Fatal(err)
	}
	SequentialRead(raw, f.Size, 1<<20, 0)
	SequentialRead(mapped, f.Size, 1<<20, 0)
	SequentialRead(pread, f.Size, 1<<20, 0)
	return mapped, pread, raw
}

func report(b *testing.B, name string, ours, ref float64, unit string, goal float64) {
	ratio := ours / ref
	verdict := "meets"
	if ratio < goal {
		verdict = "BELOW"
	}
	fmt.Printf("%-34s ours %12.0f %s  reference %12.0f %s  ratio %.2fx (goal >= %.1fx: %s)\n",
		name, ours, unit, ref, unit, ratio, goal, verdict)
	b.ReportMetric(ratio, "ratio")
}

// cpuRate sums a rate measured in wall time over runs, and the work done per
// CPU-second of this process (robust when other work shares the machine).
type cpuRate struct {
	wall      float64 // sum of per-run rates (ratios of sums are what we compare)
	work, cpu float64
}

func (c *cpuRate) add(run func() float64) {
	c0, t0 := SelfCPUSeconds(), time.Now()
	rate := run()
	c.wall += rate
	c.work += rate * time.Since(t0).Seconds()
	c.cpu += SelfCPUSeconds() - c0
}

func (c *cpuRate) perCPU() float64 { return c.work / c.cpu }

func BenchmarkRandomRead4K(b *testing.B) {
	f := fixture(b)
	im, pr, raw := openAll(b, f)
	defer im.Close()
	defer pr.Close()
	defer raw.Close()
	for range b.N {
		for _, threads := range []int{1, 4} {
			// Interleave the runs so that load from elsewhere hits all alike.
			var ref, ours, oursP cpuRate
			for range 2 {
				ref.add(func() float64 { return RandomReads(raw, f.Size, threads, time.Second) })
				ours.add(func() float64 { return RandomReads(im, f.Size, threads, time.Second) })
				oursP.add(func() float64 { return RandomReads(pr, f.Size, threads, time.Second) })
			}
			report(b, fmt.Sprintf("random 4KiB read, %d thread(s)", threads), ours.wall, ref.wall, "IOPS", 0.8)
			report(b, "  same, per CPU-second", ours.perCPU(), ref.perCPU(), "IOPS", 0.8)
			report(b, "  lowers via pread", oursP.wall, ref.wall, "IOPS", 0.8)
			report(b, "  lowers via pread, per CPU-second", oursP.perCPU(), ref.perCPU(), "IOPS", 0.8)
		}
	}
}

func BenchmarkSequentialRead(b *testing.B) {
	f := fixture(b)
	im, pr, raw := openAll(b, f)
	defer im.Close()
	defer pr.Close()
	defer raw.Close()
	for range b.N {
		for _, bs := range []int{128 << 10, 1 << 20} {
			var ref, ours, oursP cpuRate
			for range 3 {
				ref.add(func() float64 { return SequentialRead(raw, f.Size, bs, 300*time.Millisecond) })
				ours.add(func() float64 { return SequentialRead(im, f.Size, bs, 300*time.Millisecond) })
				oursP.add(func() float64 { return SequentialRead(pr, f.Size, bs, 300*time.Millisecond) })
			}
			report(b, fmt.Sprintf("sequential read, %d KiB requests", bs>>10), ours.wall, ref.wall, "MB/s", 0.8)
			report(b, "  same, per CPU-second", ours.perCPU(), ref.perCPU(), "MB/s", 0.8)
			report(b, "  lowers via pread", oursP.wall, ref.wall, "MB/s", 0.8)
			report(b, "  lowers via pread, per CPU-second", oursP.perCPU(), ref.perCPU(), "MB/s", 0.8)
		}
	}
}

func BenchmarkIndexLookup(b *testing.B) {
	for range b.N {
		small := IndexLookups(BuildIndex(1000), time.Second)
		large := IndexLookups(BuildIndex(1_000_000), time.Second)
		fmt.Printf("index lookups/s: %.0f with 1 thousand segments, %.0f with 1 million (ratio %.2fx)\n", small, large, large/small)
		b.ReportMetric(small, "lookups/s-1k")
		b.ReportMetric(large, "lookups/s-1M")
	}
}

func BenchmarkZFileVsZstdCLI(b *testing.B) {
	if _, err := exec.LookPath("zstd"); err != nil {
		b.Skip("the zstd CLI is not installed (apt-get install zstd)")
	}
	f := fixture(b)
	for range b.N {
		for _, bs := range []int{4096, 16384, 65536} {
			res, err := CompareZstd(context.Background(), f.Layers[0], bs, 3)
			if err != nil {
				b.Fatal(err)
			}
			report(b, fmt.Sprintf("zfile compress, %d KiB blocks", bs>>10), res.OursCompress, res.CLICompress, "MB/s", 0.7)
			report(b, "  same, per CPU-second", res.OursCompressCPU, res.CLICompressCPU, "MB/s", 0.7)
			report(b, fmt.Sprintf("zfile decompress, %d KiB blocks", bs>>10), res.OursDecompress, res.CLIDecompress, "MB/s", 0.8)
			report(b, "  same, per CPU-second", res.OursDecompressCPU, res.CLIDecompressCPU, "MB/s", 0.8)
			fmt.Printf("%-34s ours %.3f  zstd -3 %.3f (compressed/raw)\n", "  size ratio", res.OursRatio, res.CLIRatio)
		}
	}
}

// TestFixtureSmoke builds a small fixture and checks the stack reads exactly
// the flat file, and that every measurement runs (no timing asserted).
func TestFixtureSmoke(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f, err := NewFixture(ctx, t.TempDir(), 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Verify(ctx); err != nil {
		t.Fatal(err)
	}
	im, err := image.Open(ctx, f.Config, image.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	if RandomReads(im, f.Size, 2, 10*time.Millisecond) <= 0 || SequentialRead(im, f.Size, 1<<20, 0) <= 0 {
		t.Fatal("measurements returned nothing")
	}
	if IndexLookups(BuildIndex(1000), 10*time.Millisecond) <= 0 {
		t.Fatal("index lookups returned nothing")
	}
	if _, err := exec.LookPath("zstd"); err == nil {
		res, err := CompareZstd(ctx, f.Layers[0], 4096, 1)
		if err != nil {
			t.Fatal(err)
		}
		if res.OursRatio <= 0 || res.OursRatio >= 1 || res.CLIRatio <= 0 {
			t.Fatalf("compression ratios %+v", res)
		}
	}
}
