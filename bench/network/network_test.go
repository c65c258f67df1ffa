// Package network_bench measures network slots: acquire latency from the
// warm pool against creating on demand, creation throughput and teardown,
// all in one run inside disposable namespaces (needs root).
package network_bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/network/nettest"
)

const slots = 40

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func newManager(b *testing.B, low, high int) *network.Manager {
	b.Helper()
	w := nettest.NewWorld(b, nettest.Prefix())
	cfg := w.Config()
	cfg.PoolLow, cfg.PoolHigh = low, high
	m, err := network.New(context.Background(), cfg)
	if err != nil {
		b.Fatalf("New: %v", err)
	}
	b.Cleanup(func() { m.Shutdown(context.Background()) })
	return m
}

// acquireAll acquires n slots one after the other and returns each latency.
func acquireAll(b *testing.B, m *network.Manager, n int) ([]time.Duration, []*network.Slot) {
	b.Helper()
	lat := make([]time.Duration, 0, n)
	var got []*network.Slot
	for range n {
		start := time.Now()
		s, err := m.Acquire(context.Background())
		if err != nil {
			b.Fatalf("Acquire: %v", err)
		}
		lat = append(lat, time.Since(start))
		got = append(got, s)
	}
	return lat, got
}

func BenchmarkSlots(b *testing.B) {
	nettest.RequireRoot(b)
	for range b.N {
		// On demand: no pool, every Acquire builds a slot.
		cold := newManager(b, 0, 0)
		start := time.Now()
		coldLat, _ := acquireAll(b, cold, slots)
		seqRate := float64(slots) / time.Since(start).Seconds()
		start = time.Now()
		if err := cold.Shutdown(context.Background()); err != nil {
			b.Fatalf("Shutdown: %v", err)
		}
		destroyEach := time.Since(start) / slots

		// Two creators at once (the machine has 2 cores).
		par := newManager(b, 0, 0)
		start = time.Now()
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() { acquireAll(b, par, slots/2) })
		}
		wg.Wait()
		parRate := float64(slots) / time.Since(start).Seconds()
		par.Shutdown(context.Background())

		// Warm: the worker fills the pool first, then Acquire pops.
		warm := newManager(b, slots, slots)
		for deadline := time.Now().Add(time.Minute); warm.Stats().Pooled < slots; {
			if time.Now().After(deadline) {
				b.Fatalf("pool did not fill: %+v", warm.Stats())
			}
			time.Sleep(5 * time.Millisecond)
		}
		warmLat, taken := acquireAll(b, warm, slots)
		// Release scrubs (default policy, conntrack flush) and re-pools or,
		// above the high watermark, hands the slot to the worker.
		var relLat []time.Duration
		for _, s := range taken {
			start := time.Now()
			if err := warm.Release(context.Background(), s); err != nil {
				b.Fatalf("Release: %v", err)
			}
			relLat = append(relLat, time.Since(start))
		}
		warm.Shutdown(context.Background())

		mc, mw := median(coldLat), median(warmLat)
		fmt.Printf("network slots (n=%d): acquire on demand median %v, from warm pool median %v (%.0fx faster)\n",
			slots, mc, mw, float64(mc)/float64(mw))
		fmt.Printf("network slots: release to pool (scrub) median %v\n", median(relLat))
		fmt.Printf("network slots: created/s sequential %.1f, 2 parallel %.1f; destroy %v per slot (Shutdown)\n",
			seqRate, parRate, destroyEach)
		b.ReportMetric(float64(mc.Microseconds()), "cold-us")
		b.ReportMetric(float64(mw.Microseconds()), "warm-us")
		b.ReportMetric(seqRate, "slots/s")
	}
}
