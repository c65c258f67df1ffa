package orchestrator

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agentenv/agentenv/memimage"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/template"
)

// Guest memory images are package memimage's (o.mem); these name its
// operations for the orchestrator's files.

// newImages makes the node's memory images (New, once the memory devices
// are chosen).
func newImages(o *Orchestrator) *memimage.Images {
	opts := memimage.Options{Mu: &o.matMu, MaxLayers: o.cfg.MaxLayers, Prefetch: o.cfg.Prefetch,
		FlattenPaused: o.cfg.FlattenPaused, Background: o.goBackground, Logger: o.log}
	if o.memDev != nil { // no typed nil in the interface
		opts.Devices = o.memDev
	}
	return memimage.New(opts)
}

// registerMemoryMetrics exports what the memory images did for restores.
func (o *Orchestrator) registerMemoryMetrics(reg prometheus.Registerer) {
	if reg == nil {
		return
	}
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "aenvd_memory_workingset_prefetched_bytes_total",
		Help: "Bytes of memory working sets read ahead or pushed into the page cache while VMs restored."},
		func() float64 { return float64(o.mem.Prefetched()) }))
}

// ensureMemoryBase gives a template's snapshot a layered memory image
// (memimage.Images.EnsureBase).
func (o *Orchestrator) ensureMemoryBase(t *template.Template) error {
	return o.mem.EnsureBase(t.ID, t.Snapshot, t.Dir)
}

// restoreMemory returns the memory image a VM restored from vmDir runs on
// and the layers the restore writes over its file
// (memimage.Images.Restore).
func (o *Orchestrator) restoreMemory(ctx context.Context, vmDir string, overlay bool) (snapshot.MemoryImage, []string, error) {
	return o.mem.Restore(ctx, vmDir, overlay)
}
