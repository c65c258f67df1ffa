package repositorybench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/snapshot/repo/peer"
	"github.com/agentenv/agentenv/snapshot/repo/s3"
	"github.com/agentenv/agentenv/snapshot/repo/s3/s3test"
	"github.com/agentenv/agentenv/storage/blob"
)

type fixture struct {
	r     *repo.Repo
	path  string
	size  int64
	layer map[int64]repo.Layer // by chunk size
	peer  string               // a peer endpoint holding the layer
}

// setup starts a server and uploads the layer for one benchmark (each
// benchmark owns its fixture, so its lifetime is the benchmark's).
func setup(b *testing.B) *fixture {
	b.Helper()
	if _, ok := s3test.Binary(); !ok {
		b.Skip("versitygw is not installed (run .ci/setup.d/60-versitygw.sh)")
	}
	mib := int64(64)
	if v, err := strconv.ParseInt(os.Getenv("AENV_BENCH_LAYER_MIB"), 10, 64); err == nil && v > 0 {
		mib = v
	}
	srv := s3test.Start(b)
	cfg := srv.Bucket(b)
	ctx := context.Background()
	r, err := s3.Open(ctx, cfg, repo.Options{})
	if err != nil {
		b.Fatal(err)
	}
	f := &fixture{r: r, size: mib << 20, layer: map[int64]repo.Layer{}, path: filepath.Join(b.TempDir(), "layer")}
	out, err := os.Create(f.path)
	if err != nil {
		b.Fatal(err)
	}
	var seed [32]byte
	if _, err := io.CopyN(out, rand.NewChaCha8(seed), f.size); err != nil {
		b.Fatal(err)
	}
	out.Close()
	start := time.Now()
	for _, cs := range []int64{256 << 10, 1 << 20} {
		l, err := repo.PutLayerFile(ctx, r, f.path, cs)
		if err != nil {
			b.Fatal(err)
		}
		f.layer[cs] = l
	}
	idx := peer.NewIndex()
	idx.Add(f.layer[blob.DefaultChunkSize].Digest, f.path)
	ps := httptest.NewServer(peer.Handler(idx, ""))
	b.Cleanup(ps.Close)
	f.peer = ps.URL
	fmt.Printf("fixture: a %d MiB layer in versitygw (uploaded with tables of 256 KiB and 1 MiB chunks in %s)\n",
		mib, time.Since(start).Round(time.Millisecond))
	return f
}

// pairedRounds times ref and then path, rounds times, and returns each
// round's path/ref ratio and the two total times.
func pairedRounds(rounds int, ref, path func(round int)) (ratios []float64, refT, pathT time.Duration) {
	for i := range rounds {
		t0 := time.Now()
		ref(i)
		r := time.Since(t0)
		t0 = time.Now()
		path(i)
		p := time.Since(t0)
		ratios = append(ratios, p.Seconds()/r.Seconds())
		refT, pathT = refT+r, pathT+p
	}
	return ratios, refT, pathT
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// readWhole reads r from start to end in 1 MiB reads.
func readWhole(b *testing.B, r io.ReaderAt, size int64) {
	buf := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(buf)) {
		if _, err := r.ReadAt(buf[:min(int64(len(buf)), size-off)], off); err != nil && err != io.EOF {
			b.Fatal(err)
		}
	}
}

// BenchmarkLazyVsLocal: a whole layer read through a fresh verified lazy
// reader from the S3 server, against the same layer read from the local
// file (page cache warm: the reference is the best a node can do).
func BenchmarkLazyVsLocal(b *testing.B) {
	f := setup(b)
	ctx := context.Background()
	const rounds = 5
	for range b.N {
		ratios, localT, lazyT := pairedRounds(rounds, func(int) {
			lf, err := os.Open(f.path)
			if err != nil {
				b.Fatal(err)
			}
			readWhole(b, lf, f.size)
			lf.Close()
		}, func(int) {
			c, err := repo.OpenLayer(ctx, f.r, f.layer[blob.DefaultChunkSize], repo.LayerOptions{Cache: blob.CacheOptions{Capacity: f.size}})
			if err != nil {
				b.Fatal(err)
			}
			readWhole(b, c, f.size)
			c.Close()
		})
		m := median(ratios)
		mibps := func(d time.Duration) float64 { return float64(f.size*rounds) / d.Seconds() / (1 << 20) }
		fmt.Printf("whole layer: lazy verified read from S3 %.0f MiB/s, local file %.0f MiB/s: lazy/local time %.1fx (median of %d, spread %.1f..%.1f)\n",
			mibps(lazyT), mibps(localT), m, rounds, slices.Min(ratios), slices.Max(ratios))
		b.ReportMetric(m, "lazy/local")
		b.ReportMetric(mibps(lazyT), "lazy-MiB/s")
	}
}

// BenchmarkSparseWorkingSet: 32 random 4 KiB reads (a working set of
// 128 KiB scattered over the layer) through a fresh lazy reader: the bytes fetched
// against the layer's size, for two chunk sizes.
const sparseReads = 32

func BenchmarkSparseWorkingSet(b *testing.B) {
	f := setup(b)
	ctx := context.Background()
	for range b.N {
		for _, cs := range []int64{256 << 10, 1 << 20} {
			c, err := repo.OpenLayer(ctx, f.r, f.layer[cs], repo.LayerOptions{Cache: blob.CacheOptions{ReadAhead: 1}})
			if err != nil {
				b.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			buf := make([]byte, 4096)
			t0 := time.Now()
			for range sparseReads {
				if _, err := c.ReadAt(buf, rng.Int64N(f.size-4096)); err != nil {
					b.Fatal(err)
				}
			}
			took := time.Since(t0)
			fetched, _ := c.Source().(*blob.Verified).Fetched()
			c.Close()
			frac := float64(fetched[0]) / float64(f.size)
			fmt.Printf("sparse working set (%d x 4 KiB), %d KiB chunks: fetched %.1f MiB of %d MiB (%.2f%% of the layer, %.0fx the working set), %s\n",
				sparseReads, cs>>10, float64(fetched[0])/(1<<20), f.size>>20, 100*frac, float64(fetched[0])/(sparseReads*4096), took.Round(time.Millisecond))
			b.ReportMetric(100*frac, fmt.Sprintf("fetched-%%-%dKiB", cs>>10))
		}
	}
}

// BenchmarkFirstReadPeerVsStore: open a layer and read 4 KiB of it, through
// a peer that holds it vs through the object store.
func BenchmarkFirstReadPeerVsStore(b *testing.B) {
	f := setup(b)
	ctx := context.Background()
	l := f.layer[blob.DefaultChunkSize]
	client := &peer.Client{Peers: []string{f.peer}}
	const rounds = 15
	first := func(useP bool, off int64) time.Duration {
		t0 := time.Now()
		var c *blob.Cache
		var err error
		if useP {
			c, err = client.OpenLayer(ctx, f.r, l, blob.CacheOptions{})
		} else {
			c, err = repo.OpenLayer(ctx, f.r, l, repo.LayerOptions{})
		}
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.ReadAt(make([]byte, 4096), off); err != nil {
			b.Fatal(err)
		}
		took := time.Since(t0)
		fetched, _ := c.Source().(*blob.Verified).Fetched()
		if useP && fetched[0] == 0 {
			b.Fatal("the peer read fetched nothing from the peer")
		}
		c.Close()
		return took
	}
	for range b.N {
		var ratios, peerMs, storeMs []float64
		rng := rand.New(rand.NewPCG(3, 4))
		for i := range rounds {
			off := rng.Int64N(f.size - 4096)
			var p, s time.Duration
			if i%2 == 0 { // alternate the order so load hits both alike
				p, s = first(true, off), first(false, off)
			} else {
				s, p = first(false, off), first(true, off)
			}
			ratios = append(ratios, p.Seconds()/s.Seconds())
			peerMs, storeMs = append(peerMs, p.Seconds()*1000), append(storeMs, s.Seconds()*1000)
		}
		m := median(ratios)
		fmt.Printf("first read (open + 4 KiB): peer %.2f ms, store %.2f ms (medians): peer/store %.2fx (spread %.2f..%.2f)\n",
			median(peerMs), median(storeMs), m, slices.Min(ratios), slices.Max(ratios))
		b.ReportMetric(m, "peer/store")
		b.ReportMetric(median(peerMs), "peer-ms")
		b.ReportMetric(median(storeMs), "store-ms")
	}
}

// BenchmarkPrefetchWorkingSet: a working set of 64 blocks (clusters of
// 1-4 blocks scattered over the layer) read on demand, one miss after the
// other as a restoring VM touches them, against the same reads after a
// prefetch of the recorded working set (prefetch time included).
func BenchmarkPrefetchWorkingSet(b *testing.B) {
	f := setup(b)
	ctx := context.Background()
	l := f.layer[blob.DefaultChunkSize]
	rng := rand.New(rand.NewPCG(5, 6))
	nblocks := f.size / blob.DefaultChunkSize
	var offsets []int64
	for len(offsets) < 64 {
		start := rng.Int64N(nblocks - 4)
		for k := range 1 + rng.Int64N(4) {
			offsets = append(offsets, (start+k)*blob.DefaultChunkSize+rng.Int64N(blob.DefaultChunkSize-4096))
		}
	}
	touch := func(c *blob.Cache) {
		buf := make([]byte, 4096)
		for _, off := range offsets {
			if _, err := c.ReadAt(buf, off); err != nil {
				b.Fatal(err)
			}
		}
	}
	open := func(record bool) *blob.Cache {
		c, err := repo.OpenLayer(ctx, f.r, l, repo.LayerOptions{Cache: blob.CacheOptions{Record: record, ReadAhead: 1}})
		if err != nil {
			b.Fatal(err)
		}
		return c
	}
	rec := open(true)
	touch(rec)
	if err := f.r.PutWorkingSet(ctx, l, rec.BlockSize(), rec.Touched()); err != nil {
		b.Fatal(err)
	}
	for range b.N {
		var ratios []float64
		for range 5 {
			c := open(false)
			t0 := time.Now()
			touch(c)
			demand := time.Since(t0)

			c = open(false)
			t0 = time.Now()
			blocks, err := f.r.WorkingSet(ctx, l, c.BlockSize())
			if err != nil {
				b.Fatal(err)
			}
			if err := c.Prefetch(ctx, blocks, 4); err != nil {
				b.Fatal(err)
			}
			touch(c)
			pre := time.Since(t0)
			if _, misses, _ := c.Stats(); misses != 0 {
				b.Fatalf("%d misses after the prefetch", misses)
			}
			ratios = append(ratios, pre.Seconds()/demand.Seconds())
		}
		m := median(ratios)
		fmt.Printf("working set of %d blocks: prefetched then read / read on demand %.2fx (median of 5, spread %.2f..%.2f)\n",
			len(rec.Touched()), m, slices.Min(ratios), slices.Max(ratios))
		b.ReportMetric(m, "prefetch/demand")
	}
}
