package aenvdbench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/aenvdtest"
	"github.com/agentenv/agentenv/internal/testutil/guestassets"
)

const (
	sequential = 5  // creates one at a time
	concurrent = 10 // creates at once
)

var stages = []string{"storage", "network", "vmm_restore", "agent"}

// BenchmarkCreate: per-stage create latency, and throughput at 1 vs 10
// concurrent creates.
func BenchmarkCreate(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("aenvd needs root")
	}
	guestassets.Get(b)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	n, err := aenvdtest.Start(ctx, aenvdtest.Options{Prefix: "adbench", CIDRBase: 83,
		Env: []string{"AENVD_NETWORK_POOL_LOW=10", "AENVD_NETWORK_POOL_HIGH=12"}})
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	mustKill(b, n, mustCreate(b, n)) // warm up: page cache, pool
	b.ResetTimer()
	for range b.N {
		before := stageSums(b, n)
		t0 := time.Now()
		for range sequential {
			mustKill(b, n, mustCreate(b, n))
		}
		seq := time.Since(t0)
		after := stageSums(b, n)
		for _, st := range stages {
			d := after[st].sub(before[st])
			if d.count != sequential {
				b.Fatalf("stage %s observed %v times, want %d", st, d.count, sequential)
			}
			b.ReportMetric(d.sum/d.count*1000, st+"-ms")
		}
		// Kill time is part of seq; count creates only, from the histogram.
		createOnly := after["_total"].sub(before["_total"])
		b.ReportMetric(createOnly.sum/createOnly.count*1000, "create-ms")

		t1 := time.Now()
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
		conc := time.Since(t1)
		close(errs)
		for err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
		for _, id := range ids {
			mustKill(b, n, id)
		}
		seqRate := float64(sequential) / createOnly.sum
		concRate := float64(concurrent) / conc.Seconds()
		b.ReportMetric(seqRate, "creates/s-c1")
		b.ReportMetric(concRate, "creates/s-c10")
		b.ReportMetric(concRate/seqRate, "c10/c1-throughput")
		b.Logf("%d sequential creates (+kills) in %s; %d concurrent creates in %s", sequential, seq.Round(time.Millisecond), concurrent, conc.Round(time.Millisecond))
	}
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
// /metrics; "_total" is the successful create operation itself.
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
		for _, st := range stages {
			if strings.Contains(name, fmt.Sprintf(`op="create",stage="%s"`, st)) && strings.HasPrefix(name, "aenvd_sandbox_stage_seconds") {
				key = st
			}
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
