package aenvdbench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/aenvdtest"
	"github.com/agentenv/agentenv/internal/testutil/cpustat"
	"github.com/agentenv/agentenv/internal/testutil/guestassets"
	"github.com/agentenv/agentenv/snapshot"
)

const (
	sequential = 5  // creates one at a time
	concurrent = 10 // creates at once
)

var stages = []string{"storage", "network", "vmm_restore", "agent"}

// baselineRef is the last commit before the node-core redesign (one VM
// bring-up, durable transitions, the concurrent storage client); the
// benchmark builds aenvd from it too and prints both. AENV_BENCH_BASELINE
// names another commit, "none" skips it.
const baselineRef = "da24e4f"

// BenchmarkCreate: per-stage create latency, and throughput at 1 vs 10
// concurrent creates, for this tree and for the baseline commit, in one run.
func BenchmarkCreate(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("aenvd needs root")
	}
	guestassets.Get(b)
	ref := os.Getenv("AENV_BENCH_BASELINE")
	if ref == "" {
		ref = baselineRef
	}
	type result struct{ total, c1, c10, ratio float64 }
	results := map[string]result{}
	for _, run := range []struct{ name, ref string }{{"this tree", ""}, {"baseline " + ref, ref}} {
		if run.ref == "none" {
			continue
		}
		src := ""
		if run.ref != "" {
			src = checkout(b, run.ref)
		}
		fmt.Printf("== aenvd from %s\n", run.name)
		total, c1, c10, ratio := benchNode(b, src)
		results[run.name] = result{total, c1, c10, ratio}
	}
	cur, okc := results["this tree"]
	base, okb := results["baseline "+ref]
	if okc && okb {
		fmt.Printf("this tree vs baseline %s: create %.1f ms vs %.1f ms (%.2fx); 1 at a time %.2f/s vs %.2f/s; 10 at once %.2f/s vs %.2f/s; c10/c1 %.2fx vs %.2fx\n",
			ref, cur.total, base.total, cur.total/base.total, cur.c1, base.c1, cur.c10, base.c10, cur.ratio, base.ratio)
		b.ReportMetric(cur.total/base.total, "create-vs-baseline")
	}
}

// checkout returns a work tree of ref (cached in the temp directory).
func checkout(b *testing.B, ref string) string {
	dir := filepath.Join(os.TempDir(), "aenv-baseline-"+ref)
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
		return dir
	}
	out, err := exec.Command("git", "worktree", "add", "--detach", "-f", dir, ref).CombinedOutput()
	if err != nil {
		b.Fatalf("check out baseline %s: %v\n%s", ref, err, out)
	}
	return dir
}

// benchNode starts a node built from src ("" this tree) and measures it:
// the median whole create in ms, creates/s one at a time and 10 at once
// (last round), and the median c10/c1 ratio.
func benchNode(b *testing.B, src string) (total, c1, c10, ratio float64) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	n, err := aenvdtest.Start(ctx, aenvdtest.Options{Prefix: "adbench", CIDRBase: 83, Source: src,
		Env: []string{"AENVD_NETWORK_POOL_LOW=10", "AENVD_NETWORK_POOL_HIGH=22", "AENVD_SANDBOX_PREFETCH=true"}})
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	mustKill(b, n, mustCreate(b, n)) // warm up: page cache, pool
	b.ResetTimer()
	for range b.N {
		// Stage times per create: the histograms' sums move by exactly one
		// create's stages between two scrapes around it.
		per := map[string][]float64{}
		for range sequential {
			before := stageSums(b, n)
			id := mustCreate(b, n)
			after := stageSums(b, n)
			mustKill(b, n, id)
			for _, st := range append(stages, "_total") {
				d := after[st].sub(before[st])
				if d.count != 1 {
					b.Fatalf("stage %s observed %v times for one create", st, d.count)
				}
				per[st] = append(per[st], d.sum)
			}
		}
		fmt.Printf("create latency by stage, median of %d sequential creates:\n", sequential)
		for _, st := range append(stages, "_total") {
			med := median(per[st]) * 1000
			name := st
			if st == "_total" {
				name = "create (whole)"
			}
			fmt.Printf("  %-16s %8.1f ms  (%.0f%% of the create)\n", name, med, 100*med/(median(per["_total"])*1000))
		}
		total = median(per["_total"]) * 1000
		restore := median(per["vmm_restore"]) * 1000
		fmt.Printf("create p50 %.1f ms = %.2fx the VMM's own restore (%.1f ms; goal <= 1.5x)\n", total, total/restore, restore)

		// Throughput: one at a time (the creates' own time) vs 10 at once,
		// in rounds; the ratio's median and spread.
		var ratios []float64
		for range rounds {
			c1 = float64(sequential) / sum(runSequential(b, n))
			c10 = float64(concurrent) / runConcurrent(b, n).Seconds()
			ratios = append(ratios, c10/c1)
		}
		slices.Sort(ratios)
		ratio = median(ratios)
		fmt.Printf("create throughput: %.2f/s one at a time, %.2f/s with %d at once (last round); ratio median %.2fx [%.2f..%.2f] over %d rounds\n",
			c1, c10, concurrent, ratio, ratios[0], ratios[len(ratios)-1], rounds)
	}
	if src == "" {
		concurrencyCurve(b, n)
		prefetchComparison(b, n)
	}
	return total, c1, c10, ratio
}

// prefetchComparison prints creates on a cold page cache (dropped before
// each) with the template memory's working set read ahead and without it
// (its file moved aside), alternating, medians of coldRounds each.
func prefetchComparison(b *testing.B, n *aenvdtest.Node) {
	// Kept next to the template's memory file ("memory"), or, where VMs
	// map the storage daemon's export of the stack (the default), as the
	// snapshot directory's snapshot.WorkingSetFile (the same name): the
	// daemon then pushes it into the page cache.
	ws := filepath.Join(n.DataDir, "templates", "base", "snapshot", snapshot.WorkingSetFile)
	if _, err := os.Stat(ws); err != nil {
		// Recorded from the first create; give its background write a moment.
		id := mustCreate(b, n)
		time.Sleep(5 * time.Second)
		mustKill(b, n, id)
		if _, err := os.Stat(ws); err != nil {
			b.Fatalf("no working set recorded for the template's memory: %v", err)
		}
	}
	var with, without []float64
	for range coldRounds {
		for _, on := range []bool{true, false} {
			if !on {
				if err := os.Rename(ws, ws+".off"); err != nil {
					b.Fatal(err)
				}
			}
			if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
				b.Fatalf("drop the page cache: %v", err)
			}
			before := stageSums(b, n)["_total"]
			id := mustCreate(b, n)
			d := stageSums(b, n)["_total"].sub(before).sum
			mustKill(b, n, id) // before the next working set could be recorded
			if on {
				with = append(with, d)
			} else {
				without = append(without, d)
				if err := os.Rename(ws+".off", ws); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	w, wo := median(with)*1000, median(without)*1000
	fmt.Printf("create on a cold page cache: %.1f ms with the working set prefetched (%s), %.1f ms without (%.2fx), medians of %d\n",
		w, filepath.Base(ws), wo, w/wo, coldRounds)
}

// coldRounds of the cold-cache prefetch comparison.
const coldRounds = 3

// curve is the concurrency of each point of concurrencyCurve.
var curve = []int{1, 2, 5, 10, 20}

// concurrencyCurve prints, for c creates at once, the median latency of a
// create as its client sees it and the throughput, against c = 1: with
// nothing node-wide serialising creates, throughput grows until the CPUs
// are busy and latency grows only past that.
func concurrencyCurve(b *testing.B, n *aenvdtest.Node) {
	fmt.Printf("concurrent creates (%d CPUs): c, median latency, throughput, throughput vs c=1; the machine's CPU time busy per create and the share of all cores busy (CPU-bound or waiting); the creates' mean stages\n", runtime.NumCPU())
	var base float64
	for _, c := range curve {
		before := stageSums(b, n)
		lat, wall, busy := createBurst(b, n, c)
		after := stageSums(b, n)
		tp := float64(c) / wall.Seconds()
		if c == 1 {
			base = tp
		}
		var stagesOut []string
		for _, st := range stages {
			if d := after[st].sub(before[st]); d.count > 0 {
				stagesOut = append(stagesOut, fmt.Sprintf("%s %.0f ms", st, 1000*d.sum/d.count))
			}
		}
		fmt.Printf("  c=%-3d %8.1f ms %7.2f/s  %.2fx   cpu %5.0f ms/create, %3.0f%% busy   %s\n", c, median(lat)*1000, tp, tp/base,
			float64(busy.Milliseconds())/float64(c), 100*busy.Seconds()/(wall.Seconds()*float64(runtime.NumCPU())), strings.Join(stagesOut, ", "))
	}
}

// createBurst creates c sandboxes at once; it returns each create's
// latency in seconds, the wall time until all are up and the machine's CPU
// time busy meanwhile, then kills them.
func createBurst(b *testing.B, n *aenvdtest.Node, c int) ([]float64, time.Duration, time.Duration) {
	ids, lat, errs := make([]string, c), make([]float64, c), make([]error, c)
	cpu0, err := cpustat.Busy()
	if err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	var wg sync.WaitGroup
	for i := range c {
		wg.Go(func() {
			start := time.Now()
			ids[i], errs[i] = n.Create(`{"templateID":"base","timeout":300}`)
			lat[i] = time.Since(start).Seconds()
		})
	}
	wg.Wait()
	wall := time.Since(t0)
	cpu1, err := cpustat.Busy()
	if err != nil {
		b.Fatal(err)
	}
	for i, id := range ids {
		if errs[i] == nil {
			mustKill(b, n, id)
		}
	}
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	return lat, wall, cpu1 - cpu0
}

// rounds of the 1 vs 10 throughput comparison.
const rounds = 3

// runSequential creates (and kills) sequential sandboxes one at a time and
// returns each create's duration in seconds as aenvd measured it.
func runSequential(b *testing.B, n *aenvdtest.Node) []float64 {
	var out []float64
	for range sequential {
		before := stageSums(b, n)["_total"]
		id := mustCreate(b, n)
		out = append(out, stageSums(b, n)["_total"].sub(before).sum)
		mustKill(b, n, id)
	}
	return out
}

// runConcurrent creates concurrent sandboxes at once and returns the wall
// time until all are up, then kills them.
func runConcurrent(b *testing.B, n *aenvdtest.Node) time.Duration {
	t0 := time.Now()
	ids := make([]string, concurrent)
	var wg sync.WaitGroup
	errs := make(chan error, concurrent)
	for i := range concurrent {
		wg.Go(func() {
			id, err := n.Create(`{"templateID":"base","timeout":300}`)
			ids[i] = id
			errs <- err
		})
	}
	wg.Wait()
	d := time.Since(t0)
	close(errs)
	for err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	for _, id := range ids {
		mustKill(b, n, id)
	}
	return d
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func sum(v []float64) float64 {
	t := 0.0
	for _, x := range v {
		t += x
	}
	return t
}

func mustCreate(b *testing.B, n *aenvdtest.Node) string {
	id, err := n.Create(`{"templateID":"base","timeout":300}`)
	if err != nil {
		b.Fatal(err)
	}
	return id
}

func mustKill(b *testing.B, n *aenvdtest.Node, id string) {
	if code, body, _, err := n.Call("DELETE", "/sandboxes/"+id, n.Key, ""); err != nil || code != 204 {
		b.Fatalf("kill %s: %d %s %v", id, code, body, err)
	}
}

type sumCount struct{ sum, count float64 }

func (a sumCount) sub(b sumCount) sumCount { return sumCount{a.sum - b.sum, a.count - b.count} }

// stageSums reads the create stage histograms' sums and counts from
// /metrics, by stage; "_total" is the successful create operation itself.
func stageSums(b *testing.B, n *aenvdtest.Node) map[string]sumCount {
	text, err := n.Metrics()
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]sumCount{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		name, val, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			continue
		}
		key := ""
		if _, rest, ok := strings.Cut(name, `op="create",stage="`); ok && strings.HasPrefix(name, "aenvd_sandbox_stage_seconds") {
			key, _, _ = strings.Cut(rest, `"`)
		}
		if strings.HasPrefix(name, "aenvd_sandbox_operation_seconds") && strings.Contains(name, `op="create",result="success"`) {
			key = "_total"
		}
		if key == "" {
			continue
		}
		sc := out[key]
		switch {
		case strings.HasPrefix(name, "aenvd_sandbox_stage_seconds_sum"), strings.HasPrefix(name, "aenvd_sandbox_operation_seconds_sum"):
			sc.sum = v
		case strings.HasPrefix(name, "aenvd_sandbox_stage_seconds_count"), strings.HasPrefix(name, "aenvd_sandbox_operation_seconds_count"):
			sc.count = v
		}
		out[key] = sc
	}
	return out
}
