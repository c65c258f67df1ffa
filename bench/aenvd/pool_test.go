package aenvdbench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/aenvdtest"
	"github.com/agentenv/agentenv/internal/testutil/guestassets"
)

// poolRounds are the paired rounds of BenchmarkCreatePool: one create on
// each node per round, the order turned every round.
const poolRounds = 7

// poolStages are the create stages compared (memory is the memory image's
// resolution, a few ms either way).
var poolStages = append([]string{"memory"}, stages...)

// BenchmarkCreatePool: create latency with the warm pool of VMM processes
// off and on, in one run: two nodes of this tree side by side (the pooled
// one keeping one VMM of the base template waiting), a create on each per
// round, the pooled one only once its pool is full again (its refill never
// overlaps a measured create). Printed per stage and whole, each create
// p50 as a ratio to the VMM's own restore (the unpooled node's vmm_restore
// stage, goal <= 1.5x), and on against off.
func BenchmarkCreatePool(b *testing.B) {
	off, on := startPoolPair(b, "AENVD_SANDBOX_PREFETCH=true")
	b.ResetTimer()
	for range b.N {
		per := map[*aenvdtest.Node]map[string][]float64{off: {}, on: {}}
		hits := poolHits(b, on)
		pairedRounds(off, on, func(n *aenvdtest.Node) {
			waitPoolFull(b, on) // the pooled node's refill of the round before, done
			for st, d := range createStages(b, n) {
				per[n][st] = append(per[n][st], d)
			}
		})
		if got := poolHits(b, on) - hits; got != poolRounds {
			b.Fatalf("%d of %d creates on the pooled node took a pool entry", got, poolRounds)
		}
		printPool(b, per[off], per[on])
	}
}

// printPool prints the medians of each stage, off and on, and the ratios.
func printPool(b *testing.B, off, on map[string][]float64) {
	ms := func(m map[string][]float64, st string) float64 { return median(m[st]) * 1000 }
	fmt.Printf("create with the warm pool of VMM processes off and on, medians of %d paired rounds:\n", poolRounds)
	fmt.Printf("  %-16s %9s %9s\n", "stage", "off", "on")
	for _, st := range append(poolStages, "_total") {
		name := st
		if st == "_total" {
			name = "create (whole)"
		}
		fmt.Printf("  %-16s %6.1f ms %6.1f ms\n", name, ms(off, st), ms(on, st))
	}
	restore := ms(off, "vmm_restore")
	offTotal, onTotal := ms(off, "_total"), ms(on, "_total")
	fmt.Printf("create p50: pool off %.1f ms = %.2fx the VMM's own restore (%.1f ms), pool on %.1f ms = %.2fx it (goal <= 1.5x); on/off %.2fx; the pooled VMM's state load %.1f ms\n",
		offTotal, offTotal/restore, restore, onTotal, onTotal/restore, onTotal/offTotal, ms(on, "vmm_restore"))
	b.ReportMetric(onTotal/offTotal, "pool-on-vs-off")
	b.ReportMetric(onTotal/restore, "pool-on-vs-restore")
	b.ReportMetric(offTotal/restore, "pool-off-vs-restore")
}

// createStages makes one sandbox on n, kills it and returns its stages'
// durations in seconds ("_total": the whole create), as aenvd measured them.
func createStages(b *testing.B, n *aenvdtest.Node) map[string]float64 {
	before := stageSums(b, n)
	id := mustCreate(b, n)
	after := stageSums(b, n)
	mustKill(b, n, id)
	out := map[string]float64{}
	for _, st := range append(poolStages, "_total") {
		d := after[st].sub(before[st])
		if d.count != 1 {
			b.Fatalf("stage %s observed %v times for one create", st, d.count)
		}
		out[st] = d.sum
	}
	return out
}

// pairedRounds calls round poolRounds times on each node, the order
// turned every round (neither node always goes first).
func pairedRounds(off, on *aenvdtest.Node, round func(*aenvdtest.Node)) {
	for r := range poolRounds {
		order := []*aenvdtest.Node{off, on}
		if r%2 == 1 {
			order = []*aenvdtest.Node{on, off}
		}
		for _, n := range order {
			round(n)
		}
	}
}

// startPoolPair starts two nodes of this tree with env (closed with the
// benchmark), the second keeping one VMM of the base template waiting in
// its warm pool, and warms both up (page cache, slot and device pools).
// Skips without root (aenvd needs it).
func startPoolPair(b *testing.B, env ...string) (off, on *aenvdtest.Node) {
	if os.Geteuid() != 0 {
		b.Skip("aenvd needs root")
	}
	guestassets.Get(b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	b.Cleanup(cancel) // after the nodes' Close (cleanups run last-in first-out)
	env = append([]string{"AENVD_NETWORK_POOL_LOW=4", "AENVD_NETWORK_POOL_HIGH=8"}, env...)
	off = startBenchNode(ctx, b, "adbench", 83, env)
	on = startBenchNode(ctx, b, "adbpool", 99, append(env, "AENVD_VMM_POOL_LOW=1", "AENVD_VMM_POOL_HIGH=1", "AENVD_VMM_POOL_TEMPLATES=base"))
	for _, n := range []*aenvdtest.Node{off, on} {
		waitPoolFull(b, n)
		mustKill(b, n, mustCreate(b, n))
	}
	return off, on
}

// startBenchNode starts a node of this tree, closed with the benchmark.
func startBenchNode(ctx context.Context, b *testing.B, prefix string, cidr int, env []string) *aenvdtest.Node {
	n, err := aenvdtest.Start(ctx, aenvdtest.Options{Prefix: prefix, CIDRBase: cidr, Env: env})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = n.Close() })
	return n
}

// nodePool is /nodes' report of the warm pool (nil: off).
func nodePool(b *testing.B, n *aenvdtest.Node) *struct{ Ready, Starting, High, Hits int64 } {
	code, body, _, err := n.Call("GET", "/nodes", n.Key, "")
	if err != nil || code != 200 {
		b.Fatalf("/nodes: %d %s %v", code, body, err)
	}
	var nodes []struct {
		VMMPool *struct{ Ready, Starting, High, Hits int64 } `json:"vmmPool"`
	}
	if err := json.Unmarshal(body, &nodes); err != nil || len(nodes) != 1 {
		b.Fatalf("/nodes: %s %v", body, err)
	}
	return nodes[0].VMMPool
}

// waitPoolFull waits until n's pool (if any) is full and fills nothing.
func waitPoolFull(b *testing.B, n *aenvdtest.Node) {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		p := nodePool(b, n)
		if p == nil || p.Ready == p.High && p.Starting == 0 {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("the warm pool did not fill: %+v", *p)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// poolHits is how many creates took a pool entry on n.
func poolHits(b *testing.B, n *aenvdtest.Node) int {
	p := nodePool(b, n)
	if p == nil {
		b.Fatal("the pooled node reports no warm pool")
	}
	return int(p.Hits)
}
