package metricsring

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/agentenv/agentenv/orchestrator"
	"github.com/agentenv/agentenv/sandbox"
)

// source is a scripted orchestrator: the sandboxes it lists and the
// readings their agents give, one per call.
type source struct {
	mu    sync.Mutex
	recs  []sandbox.Record
	ts    int64
	calls map[string]int
}

func (s *source) List() []sandbox.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]sandbox.Record(nil), s.recs...)
}

func (s *source) Metrics(_ context.Context, id string) (*orchestrator.GuestMetrics, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if id == "broken" {
		return nil, errors.New("agent unreachable")
	}
	s.calls[id]++
	s.ts++
	return &orchestrator.GuestMetrics{TS: s.ts, CPUCount: 1, MemUsed: int64(s.calls[id])}, nil
}

func TestRingBoundAndRange(t *testing.T) {
	h := New(nil, 0, 4, nil)
	for ts := int64(1); ts <= 10; ts++ {
		h.Add("a", Sample{TS: ts})
	}
	h.Add("a", Sample{TS: 5}) // older than the newest: dropped
	ts := func(ss []Sample) []int64 {
		var out []int64
		for _, s := range ss {
			out = append(out, s.TS)
		}
		return out
	}
	for _, c := range []struct {
		start, end int64
		want       []int64
	}{
		{0, 0, []int64{7, 8, 9, 10}}, // the ring keeps the newest four
		{8, 0, []int64{8, 9, 10}},
		{0, 8, []int64{7, 8}},
		{8, 9, []int64{8, 9}},
		{11, 20, nil},
		{9, 8, nil},
	} {
		got := ts(h.Range("a", c.start, c.end))
		if len(got) != len(c.want) {
			t.Errorf("range %d..%d: %v, want %v", c.start, c.end, got, c.want)
			continue
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Errorf("range %d..%d: %v, want %v", c.start, c.end, got, c.want)
				break
			}
		}
	}
	if l, ok := h.Latest("a"); !ok || l.TS != 10 {
		t.Errorf("latest %v %v, want ts 10", l, ok)
	}
	if _, ok := h.Latest("none"); ok {
		t.Error("a sandbox never sampled has a latest sample")
	}
	if got := h.Range("none", 0, 0); got == nil || len(got) != 0 {
		t.Errorf("range of an unknown sandbox: %v, want empty (not null)", got)
	}
}

func TestSampleOnce(t *testing.T) {
	src := &source{calls: map[string]int{}, recs: []sandbox.Record{
		{ID: "run", State: sandbox.Running}, {ID: "paused", State: sandbox.Paused},
		{ID: "broken", State: sandbox.Running},
	}}
	h := New(src, 0, 8, nil)
	h.Add("paused", Sample{TS: 100})
	h.Add("gone", Sample{TS: 100})
	h.SampleOnce(t.Context())
	h.SampleOnce(t.Context())
	if got := h.Range("run", 0, 0); len(got) != 2 || got[1].MemUsed != 2 {
		t.Errorf("running sandbox: %+v, want two samples", got)
	}
	if src.calls["paused"] != 0 || len(h.Range("paused", 0, 0)) != 1 {
		t.Errorf("paused sandbox: sampled %d times, history %v; want kept, not sampled", src.calls["paused"], h.Range("paused", 0, 0))
	}
	if len(h.Range("gone", 0, 0)) != 0 || len(h.Range("broken", 0, 0)) != 0 {
		t.Error("a removed sandbox's history was kept, or a failing agent produced samples")
	}
}

func TestStartClose(t *testing.T) {
	src := &source{calls: map[string]int{}, recs: []sandbox.Record{{ID: "run", State: sandbox.Running}}}
	h := New(src, 0, 8, nil)
	h.Start(context.Background())
	h.Close() // returns only once the sampler goroutine is gone
	src.mu.Lock()
	n := src.calls["run"]
	src.mu.Unlock()
	h.SampleOnce(t.Context())
	if got := len(h.Range("run", 0, 0)); got != n+1 {
		t.Errorf("%d samples after Close and one more SampleOnce, want %d: the sampler still runs", got, n+1)
	}
}
