// Package metricsring owns the node's recent history of sandbox resource
// samples (CPU, memory, disk): a bounded ring per sandbox, filled by a
// sampler that asks each running sandbox's agent every few seconds, and
// read by range for GET /sandboxes/{id}/metrics and by latest sample for
// GET /sandboxes/metrics. The history lives in memory only: after a node
// restart it starts again (E2B's is also a recent-window view).
package metricsring

import (
	"context"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/agentenv/agentenv/orchestrator"
	"github.com/agentenv/agentenv/sandbox"
)

// Sample is one reading of a sandbox's agent.
type Sample = orchestrator.GuestMetrics

// Source is what the sampler needs of the orchestrator.
type Source interface {
	List() []sandbox.Record
	Metrics(ctx context.Context, id string) (*orchestrator.GuestMetrics, error)
}

// Defaults: a sample every 5 s, an hour of them per sandbox.
const (
	DefaultInterval = 5 * time.Second
	DefaultSize     = 720
)

// ring is a fixed-capacity buffer of samples in arrival order.
type ring struct {
	buf  []Sample
	next int
	full bool
}

func (r *ring) add(s Sample) {
	r.buf[r.next] = s
	r.next = (r.next + 1) % len(r.buf)
	if r.next == 0 {
		r.full = true
	}
}

// all returns the samples oldest first.
func (r *ring) all() []Sample {
	if !r.full {
		return append([]Sample(nil), r.buf[:r.next]...)
	}
	return append(append([]Sample(nil), r.buf[r.next:]...), r.buf[:r.next]...)
}

// History holds the rings and runs the sampler (Start/Close).
type History struct {
	src      Source
	interval time.Duration
	size     int
	log      *slog.Logger

	mu    sync.Mutex
	rings map[string]*ring

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New returns an empty history of at most size samples per sandbox,
// sampled every interval once started (zero values take the defaults).
func New(src Source, interval time.Duration, size int, log *slog.Logger) *History {
	if interval <= 0 {
		interval = DefaultInterval
	}
	if size <= 0 {
		size = DefaultSize
	}
	if log == nil {
		log = slog.Default()
	}
	return &History{src: src, interval: interval, size: size, log: log.With("component", "metrics-history"), rings: map[string]*ring{}}
}

// Interval is the time between samples.
func (h *History) Interval() time.Duration { return h.interval }

// Add records a sample of sandbox id; a sample not newer than the last is
// dropped, so the ring stays in time order.
func (h *History) Add(id string, s Sample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.rings[id]
	if r == nil {
		r = &ring{buf: make([]Sample, h.size)}
		h.rings[id] = r
	}
	if n := len(r.buf); r.full || r.next > 0 {
		if last := r.buf[(r.next-1+n)%n]; s.TS <= last.TS {
			return
		}
	}
	r.add(s)
}

// Range returns the samples of id with start <= TS <= end (unix seconds;
// zero start or end leaves that side open), oldest first.
func (h *History) Range(id string, start, end int64) []Sample {
	h.mu.Lock()
	r := h.rings[id]
	var all []Sample
	if r != nil {
		all = r.all()
	}
	h.mu.Unlock()
	lo := sort.Search(len(all), func(i int) bool { return all[i].TS >= start })
	hi := len(all)
	if end != 0 {
		hi = sort.Search(len(all), func(i int) bool { return all[i].TS > end })
	}
	if lo >= hi {
		return []Sample{}
	}
	return all[lo:hi]
}

// Latest returns the newest sample of id.
func (h *History) Latest(id string) (Sample, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := h.rings[id]
	if r == nil || (!r.full && r.next == 0) {
		return Sample{}, false
	}
	n := len(r.buf)
	return r.buf[(r.next-1+n)%n], true
}

// Start runs the sampler until Close.
func (h *History) Start(ctx context.Context) {
	ctx, h.cancel = context.WithCancel(ctx)
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		t := time.NewTicker(h.interval)
		defer t.Stop()
		for {
			h.SampleOnce(ctx)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

// Close stops the sampler and waits for it.
func (h *History) Close() {
	if h.cancel != nil {
		h.cancel()
	}
	h.wg.Wait()
}

// SampleOnce takes one sample of every running sandbox and forgets the
// history of sandboxes that no longer exist (paused ones keep theirs).
func (h *History) SampleOnce(ctx context.Context) {
	live := map[string]bool{}
	for _, rec := range h.src.List() {
		live[rec.ID] = true
		if rec.State != sandbox.Running {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, h.interval)
		m, err := h.src.Metrics(sctx, rec.ID)
		cancel()
		if err != nil || m == nil {
			if err != nil && ctx.Err() == nil {
				h.log.Debug("sample sandbox metrics", "sandbox", rec.ID, "err", err)
			}
			continue
		}
		h.Add(rec.ID, *m)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for id := range h.rings {
		if !live[id] {
			delete(h.rings, id)
		}
	}
}
