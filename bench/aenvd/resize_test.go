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
// sandbox (the base template's 512 MiB: shrunk to 256 MiB, then grown back
// to all 512) through PATCH /sandboxes/{id}/memory, client side to the
// answer (which comes once the guest has it, polled every 100 ms), next to
// the shrink that precedes it, and printed against two references measured
// in the same run: the guest itself writing 256 MiB (a process touching as
// much memory as the plug gives back, less an empty command's round trip)
// and a plain create. Medians of resizeRounds rounds; no time is asserted.
func BenchmarkResizeMemory(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("aenvd needs root")
	}
	guestassets.Get(b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	b.Cleanup(cancel)
	// The plug gives back 256 MiB: the node's template gets 512.
	n := startBenchNode(ctx, b, "adbresz", 115, []string{"AENVD_GUEST_MEMORY_MIB=512"})
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
			shrink = append(shrink, timed(`{"memoryMB":256}`))
			plug = append(plug, timed(`{"memoryMB":512}`))
			empty := sh(ctx, b, n, id, "true")
			write := sh(ctx, b, n, id, `python3 -c 'b = b"\x01" * (256 << 20)'`)
			touch = append(touch, write-empty)
			mustKill(b, n, id)
		}
		c, s, p, w := median(create)*1000, median(shrink)*1000, median(plug)*1000, median(touch)*1000
		fmt.Printf("memory resize of a base sandbox (512 MiB), medians of %d rounds:\n", resizeRounds)
		fmt.Printf("  shrink 512 -> 256 MiB %.1f ms; plug 256 -> 512 MiB %.1f ms\n", s, p)
		fmt.Printf("  references: the guest writing 256 MiB %.1f ms (plug %.2fx); a create %.1f ms (plug %.2fx)\n", w, p/w, c, p/c)
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
