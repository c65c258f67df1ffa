package aenvdbench

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/testutil/guestassets"
)

// resizeRounds is how many shrink and plug rounds BenchmarkResizeMemory
// times.
const resizeRounds = 3

// BenchmarkResizeMemory: the time to plug memory back into a running
// sandbox (the base template at 1536 MiB: shrunk to 512 MiB, then 1 GiB
// plugged back) through PATCH /sandboxes/{id}/memory, client side to the
// answer (which comes once the guest has it, polled every 100 ms), next to
// the shrink that precedes it, and printed against two references measured
// in the same run: the guest itself writing 1 GiB (a process touching as
// much memory as the plug gives back, less an empty command's round trip)
// and a plain create. Medians of resizeRounds rounds; no time is asserted.
func BenchmarkResizeMemory(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("aenvd needs root")
	}
	guestassets.Get(b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	b.Cleanup(cancel)
	// The plug gives back 1 GiB: the node's template gets 1536 MiB.
	n := startBenchNode(ctx, b, "adbresz", 115, []string{"AENVD_GUEST_MEMORY_MIB=1536"})
	b.ResetTimer()
	for range b.N {
		var create, shrink, plug, touch []float64
		for range resizeRounds {
			t0 := time.Now()
			id := mustCreate(b, n)
			create = append(create, time.Since(t0).Seconds())
			timed := func(body string) float64 {
				t0 := time.Now()
				call(b, n, "PATCH", "/sandboxes/"+id+"/memory", body, 200)
				return time.Since(t0).Seconds()
			}
			shrink = append(shrink, timed(`{"memoryMB":512}`))
			plug = append(plug, timed(`{"memoryMB":1536}`))
			empty := sh(ctx, b, n, id, "true")
			write := sh(ctx, b, n, id, `python3 -c 'b = b"\x01" * (1 << 30)'`)
			touch = append(touch, write-empty)
			mustKill(b, n, id)
		}
		c, s, p, w := median(create)*1000, median(shrink)*1000, median(plug)*1000, median(touch)*1000
		fmt.Printf("memory resize of a base sandbox (1536 MiB), medians of %d rounds:\n", resizeRounds)
		fmt.Printf("  shrink 1536 -> 512 MiB %.1f ms; plug 512 -> 1536 MiB (1 GiB) %.1f ms\n", s, p)
		fmt.Printf("  references: the guest writing 1 GiB %.1f ms (plug %.2fx); a create %.1f ms (plug %.2fx)\n", w, p/w, c, p/c)
		b.ReportMetric(p/w, "plug-vs-touch")
		b.ReportMetric(p/c, "plug-vs-create")
	}
}

// sh runs script in the sandbox as root and returns its round trip in
// seconds.
func sh(ctx context.Context, b *testing.B, n interface {
	Sh(context.Context, string, string) (string, error)
}, id, script string) float64 {
	t0 := time.Now()
	if out, err := n.Sh(ctx, id, script); err != nil {
		b.Fatalf("sandbox %s: %s: %v %s", id, script, err, out)
	}
	return time.Since(t0).Seconds()
}
