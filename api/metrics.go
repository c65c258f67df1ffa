package api

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/orchestrator"
)

// maxMetricsIDs bounds the sandboxes one GET /sandboxes/metrics names.
const maxMetricsIDs = 100

// GetSandboxMetrics implements ServerInterface: the history's samples
// within start..end (unix seconds, both optional), oldest first. A running
// sandbox whose newest sample is older than the sampling interval is
// sampled now, so the answer always ends with a current reading.
func (s *Server) GetSandboxMetrics(w http.ResponseWriter, r *http.Request, sandboxID wire.SandboxID, params wire.GetSandboxMetricsParams) {
	rec, err := s.o.Get(sandboxID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	start, end := deref(params.Start), deref(params.End)
	if start < 0 || end < 0 || (end != 0 && start > end) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("bad range start=%d end=%d", start, end))
		return
	}
	h := s.opts.MetricsHistory
	if h == nil {
		s.metricsNow(w, r, rec)
		return
	}
	if rec.State == orchestrator.Running {
		if err := s.freshen(r.Context(), sandboxID); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	samples := h.Range(sandboxID, start, end)
	out := make([]wire.SandboxMetric, 0, len(samples))
	for _, m := range samples {
		out = append(out, sandboxMetric(m))
	}
	writeJSON(w, http.StatusOK, out)
}

// freshen samples a running sandbox now unless the history has a sample
// within the last interval.
func (s *Server) freshen(ctx context.Context, id string) error {
	h := s.opts.MetricsHistory
	if last, ok := h.Latest(id); ok && time.Since(time.Unix(last.TS, 0)) < h.Interval() {
		return nil
	}
	m, err := s.o.Metrics(ctx, id)
	if err != nil {
		return err
	}
	if m != nil {
		h.Add(id, *m)
	}
	return nil
}

// metricsNow answers one sample taken now (none for a paused sandbox):
// the behaviour without a history.
func (s *Server) metricsNow(w http.ResponseWriter, r *http.Request, rec orchestrator.Record) {
	m, err := s.o.Metrics(r.Context(), rec.ID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := []wire.SandboxMetric{}
	if m != nil {
		out = append(out, sandboxMetric(*m))
	}
	writeJSON(w, http.StatusOK, out)
}

// GetSandboxesMetrics implements ServerInterface: the newest sample of
// each named running sandbox.
func (s *Server) GetSandboxesMetrics(w http.ResponseWriter, r *http.Request, params wire.GetSandboxesMetricsParams) {
	ids := slices.DeleteFunc(slices.Clone(params.SandboxIds), func(id string) bool { return id == "" })
	if len(ids) == 0 || len(ids) > maxMetricsIDs {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("sandbox_ids must name 1..%d sandboxes", maxMetricsIDs))
		return
	}
	out := wire.SandboxesWithMetrics{Sandboxes: map[string]wire.SandboxMetric{}}
	for _, id := range ids {
		if _, done := out.Sandboxes[id]; done {
			continue
		}
		rec, err := s.o.Get(id)
		if err != nil || rec.State != orchestrator.Running {
			continue
		}
		if m, ok := s.latest(r.Context(), id); ok {
			out.Sandboxes[id] = sandboxMetric(m)
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// latest is a running sandbox's newest sample: the history's, or one
// taken now without a history or before the first sampling.
func (s *Server) latest(ctx context.Context, id string) (orchestrator.GuestMetrics, bool) {
	if h := s.opts.MetricsHistory; h != nil {
		if m, ok := h.Latest(id); ok {
			return m, true
		}
	}
	m, err := s.o.Metrics(ctx, id)
	if err != nil || m == nil {
		return orchestrator.GuestMetrics{}, false
	}
	if h := s.opts.MetricsHistory; h != nil {
		h.Add(id, *m)
	}
	return *m, true
}

func sandboxMetric(m orchestrator.GuestMetrics) wire.SandboxMetric {
	return wire.SandboxMetric{Timestamp: time.Unix(m.TS, 0).UTC(), TimestampUnix: m.TS, CpuCount: int32(m.CPUCount),
		CpuUsedPct: float32(m.CPUUsedPct), MemUsed: m.MemUsed, MemTotal: m.MemTotal, DiskUsed: m.DiskUsed, DiskTotal: m.DiskTotal}
}
