package network

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	pooled, inUse  prometheus.Gauge
	acquire        *prometheus.CounterVec
	createSeconds  prometheus.Histogram
	destroySeconds prometheus.Histogram
}

func newMetrics(prefix string, reg prometheus.Registerer) *metrics {
	labels := prometheus.Labels{"prefix": prefix}
	buckets := prometheus.ExponentialBuckets(0.0005, 2, 14) // 0.5 ms .. 4 s
	m := &metrics{
		pooled: prometheus.NewGauge(prometheus.GaugeOpts{Name: "aenv_network_pool_slots",
			Help: "Warm network slots ready to be acquired.", ConstLabels: labels}),
		inUse: prometheus.NewGauge(prometheus.GaugeOpts{Name: "aenv_network_slots_in_use",
			Help: "Network slots held by sandboxes.", ConstLabels: labels}),
		acquire: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "aenv_network_acquire_total",
			Help: "Slot acquisitions by source (pool or created).", ConstLabels: labels}, []string{"source"}),
		createSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "aenv_network_slot_create_seconds",
			Help: "Time to create a network slot.", ConstLabels: labels, Buckets: buckets}),
		destroySeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "aenv_network_slot_destroy_seconds",
			Help: "Time to destroy a network slot.", ConstLabels: labels, Buckets: buckets}),
	}
	if reg != nil {
		reg.MustRegister(m.pooled, m.inUse, m.acquire, m.createSeconds, m.destroySeconds)
	}
	return m
}

func (m *metrics) setPool(pooled, inUse int) {
	m.pooled.Set(float64(pooled))
	m.inUse.Set(float64(inUse))
}

func (m *metrics) acquired(source string) { m.acquire.WithLabelValues(source).Inc() }
