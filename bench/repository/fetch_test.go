package repositorybench

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/storage/blob"
)

// BenchmarkFetchLayer: a layer copied whole into a local file the way a
// node keeps a layer it lacks (repo.FetchLayer: every chunk verified
// against the layer's table, then the whole digest, then fsync and rename)
// against one plain GET of the same object written to a file and fsynced
// (no verification: the least a copy from the store costs).
func BenchmarkFetchLayer(b *testing.B) {
	f := setup(b)
	ctx := context.Background()
	l := f.layer[blob.DefaultChunkSize]
	dir := b.TempDir()
	const rounds = 5
	for range b.N {
		ratios, getT, fetchT := pairedRounds(rounds, func(i int) {
			plainGet(b, ctx, f.r, l, filepath.Join(dir, fmt.Sprintf("get-%d", i)))
		}, func(i int) {
			c, err := repo.OpenLayer(ctx, f.r, l, repo.LayerOptions{})
			if err != nil {
				b.Fatal(err)
			}
			if err := repo.FetchLayer(ctx, c, l, filepath.Join(dir, fmt.Sprintf("fetch-%d", i))); err != nil {
				b.Fatal(err)
			}
			c.Close()
		})
		m := median(ratios)
		mibps := func(d time.Duration) float64 { return float64(f.size*rounds) / d.Seconds() / (1 << 20) }
		fmt.Printf("fetch a whole layer: verified FetchLayer %.0f MiB/s, one plain GET %.0f MiB/s: fetch/get time %.2fx (median of %d, spread %.2f..%.2f)\n",
			mibps(fetchT), mibps(getT), m, rounds, slices.Min(ratios), slices.Max(ratios))
		b.ReportMetric(m, "fetch/get")
		b.ReportMetric(mibps(fetchT), "fetch-MiB/s")
	}
}

// plainGet copies blob l of r into path with one request, and fsyncs it.
func plainGet(b *testing.B, ctx context.Context, r repo.Repository, l repo.Layer, path string) {
	rc, err := r.ReadBlob(ctx, l.Digest, 0, -1)
	if err != nil {
		b.Fatal(err)
	}
	defer rc.Close()
	out, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer out.Close()
	if _, err := io.Copy(out, rc); err != nil {
		b.Fatal(err)
	}
	if err := out.Sync(); err != nil {
		b.Fatal(err)
	}
}
