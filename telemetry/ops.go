package telemetry

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Ops are the Prometheus metrics of the sandbox lifecycle's operations
// (create, pause, resume, snapshot, kill) and their stages.
type Ops struct {
	seconds *prometheus.HistogramVec
	stages  *prometheus.HistogramVec
	total   *prometheus.CounterVec
	// Creates and CreateFails feed the /nodes snapshot.
	Creates, CreateFails atomic.Int64
}

// NewOps registers the operation metrics with reg (nil: none).
func NewOps(reg prometheus.Registerer) *Ops {
	m := &Ops{
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "aenvd_sandbox_operation_seconds", Help: "Latency of sandbox lifecycle operations.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 16),
		}, []string{"op", "result"}),
		stages: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "aenvd_sandbox_stage_seconds", Help: "Latency of the stages of create and resume (storage, network, vmm_restore, agent) and of pause (stop_vcpus, capture_seal, record, stop_vmm, release).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18),
		}, []string{"op", "stage"}),
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aenvd_sandbox_operations_total", Help: "Sandbox lifecycle operations by result.",
		}, []string{"op", "result"}),
	}
	if reg != nil {
		reg.MustRegister(m.seconds, m.stages, m.total)
	}
	return m
}

// Observe starts timing op; call the result with the operation's error.
func (m *Ops) Observe(op string) func(error) {
	start := time.Now()
	return func(err error) {
		result := "success"
		if err != nil {
			result = "failure"
		}
		m.seconds.WithLabelValues(op, result).Observe(time.Since(start).Seconds())
		m.total.WithLabelValues(op, result).Inc()
		if op == "create" && err != nil {
			m.CreateFails.Add(1)
		} else if op == "create" {
			m.Creates.Add(1)
		}
	}
}

// Stage returns a function that records the time since the previous call
// (or since stage was called) under op and the given stage name.
func (m *Ops) Stage(op string) func(stage string) {
	last := time.Now()
	return func(stage string) {
		now := time.Now()
		m.stages.WithLabelValues(op, stage).Observe(now.Sub(last).Seconds())
		last = now
	}
}
