package orchestrator

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	seconds *prometheus.HistogramVec
	total   *prometheus.CounterVec
	// creates and createFails feed the /nodes snapshot.
	creates, createFails atomic.Int64
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "aenvd_sandbox_operation_seconds", Help: "Latency of sandbox lifecycle operations.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 16),
		}, []string{"op", "result"}),
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "aenvd_sandbox_operations_total", Help: "Sandbox lifecycle operations by result.",
		}, []string{"op", "result"}),
	}
	if reg != nil {
		reg.MustRegister(m.seconds, m.total)
	}
	return m
}

// observe starts timing op; call the result with the operation's error.
func (m *metrics) observe(op string) func(error) {
	start := time.Now()
	return func(err error) {
		result := "success"
		if err != nil {
			result = "failure"
		}
		m.seconds.WithLabelValues(op, result).Observe(time.Since(start).Seconds())
		m.total.WithLabelValues(op, result).Inc()
		if op == "create" && err != nil {
			m.createFails.Add(1)
		} else if op == "create" {
			m.creates.Add(1)
		}
	}
}
