package aenvdbench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/aenvdtest"
)

// BenchmarkResumePool: the resume of a paused sandbox with the warm pool
// of VMM processes off and on, in one run: two nodes of this tree side by
// side, both keeping paused memory layered (no background flatten, so each
// resume maps the template's memory file with the pause's pages written
// in, the only resume a pooled VMM can take), paired rounds with the order
// turned every round. Each round creates a sandbox on each node, dirties a
// few MiB, pauses it and times its resume through the API (client side, to
// the answer); the pooled node's pool is full before every measured call.
// Printed: resume p50 off and on, on/off, and each against the create p50
// of the same node in the same run (the goal: resume <= 1.2x
// create).
func BenchmarkResumePool(b *testing.B) {
	// Flattened memory files (no shared exports): a resume onto a pooled
	// VMM writes the pause's layers over the template's file, which a VM
	// mapping an export does not do.
	off, on := startPoolPair(b, "AENVD_SANDBOX_FLATTEN_PAUSED=false", "AENVD_STORAGE_SHARED_MEMORY=none")
	b.ResetTimer()
	for range b.N {
		resume := map[*aenvdtest.Node][]float64{}
		create := map[*aenvdtest.Node][]float64{}
		hits := poolHits(b, on)
		pairedRounds(off, on, func(n *aenvdtest.Node) {
			c, rs := pauseResume(b, n, on)
			create[n], resume[n] = append(create[n], c), append(resume[n], rs)
		})
		// Every create and every resume on the pooled node took an entry.
		if got := poolHits(b, on) - hits; got != 2*poolRounds {
			b.Fatalf("%d of %d creates and resumes on the pooled node took a pool entry", got, 2*poolRounds)
		}
		offR, onR := median(resume[off])*1000, median(resume[on])*1000
		offC, onC := median(create[off])*1000, median(create[on])*1000
		fmt.Printf("resume (paused memory layered, a few MiB dirtied) with the warm pool of VMM processes off and on, medians of %d paired rounds:\n", poolRounds)
		fmt.Printf("  pool off: resume %.1f ms, create %.1f ms: resume/create %.2fx (goal <= 1.2x)\n", offR, offC, offR/offC)
		fmt.Printf("  pool on:  resume %.1f ms, create %.1f ms: resume/create %.2fx (goal <= 1.2x)\n", onR, onC, onR/onC)
		fmt.Printf("  resume on/off %.2fx\n", onR/offR)
		b.ReportMetric(onR/offR, "resume-pool-on-vs-off")
		b.ReportMetric(onR/onC, "resume-vs-create-pool-on")
		b.ReportMetric(offR/offC, "resume-vs-create-pool-off")
	}
}

// pauseResume creates a sandbox on n, dirties 8 MiB of its memory, pauses
// and resumes it and kills it; it returns the create's and the resume's
// client-side durations in seconds. pooled's pool is full before each.
func pauseResume(b *testing.B, n, pooled *aenvdtest.Node) (create, resume float64) {
	waitPoolFull(b, pooled)
	t0 := time.Now()
	id := mustCreate(b, n)
	create = time.Since(t0).Seconds()
	if _, err := n.Sh(context.Background(), id, "head -c 8388608 /dev/urandom > /dev/shm/dirty"); err != nil {
		b.Fatal(err)
	}
	call(b, n, "POST", "/sandboxes/"+id+"/pause", "", 204)
	waitPoolFull(b, pooled)
	t0 = time.Now()
	call(b, n, "POST", "/sandboxes/"+id+"/connect", `{"timeout":300}`, 201)
	resume = time.Since(t0).Seconds()
	mustKill(b, n, id)
	return create, resume
}

// call makes an API call and fails on another status than want.
func call(b *testing.B, n *aenvdtest.Node, method, path, body string, want int) {
	if code, out, _, err := n.Call(method, path, n.Key, body); err != nil || code != want {
		b.Fatalf("%s %s: %d %s %v", method, path, code, out, err)
	}
}
