package orchestrator

import (
	"context"

	"github.com/agentenv/agentenv/lifecycle"
	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/vmm"
)

// live is a registered sandbox as the verbs of package lifecycle see it
// (lifecycle.Sandbox); its operation lock is held.
type live struct {
	o *Orchestrator
	s *instance
}

func (o *Orchestrator) live(s *instance) lifecycle.Sandbox { return live{o, s} }

func (l live) Record() sandbox.Record {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	return l.s.rec
}

func (l live) Machine() vmm.Machine {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	return l.s.machine()
}

func (l live) Slot() *network.Slot {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	return l.s.slot()
}

func (l live) Adopted() bool { return false }

// RecordNew writes a new sandbox's first record, in state starting
// (lifecycle.Newborn): a crash from here on is rolled back by recovery.
func (l live) RecordNew() error {
	rec := l.Record()
	rec.State = "" // not written yet
	return l.o.journal.Transition(rec, sandbox.Starting, nil, func(r sandbox.Record) { l.o.setRecord(l.s, r) })
}

func (l live) Transition(to sandbox.State, change func(*sandbox.Record)) error {
	return l.o.transition(l.s, to, change)
}

func (l live) Update(change func(*sandbox.Record)) error { return l.o.update(l.s, change) }

func (l live) Set(change func(*sandbox.Record)) {
	l.s.mu.Lock()
	change(&l.s.rec)
	l.s.mu.Unlock()
}

func (l live) StopVM(ctx context.Context)         { l.o.stopVM(ctx, l.s) }
func (l live) ReleaseDevices(ctx context.Context) { l.o.releaseDevice(ctx, l.s) }

// removal is what a kill or removal of s does beyond the sandbox's own
// resources (lifecycle.Removal): its volumes go back, its timer stops,
// and the registry, the repository's uploads, the lazy disks and the
// memory flattens forget it.
func (o *Orchestrator) removal(s *instance) lifecycle.Removal {
	return lifecycle.Removal{
		Volumes: func(ctx context.Context, _ sandbox.Record) { o.returnVolumes(ctx, s) },
		Forget: func(rec sandbox.Record) {
			o.stopTimer(s)
			o.unlist(s)
			o.afterRemoved(rec) // the repository cancels its pause uploads
			o.disks.Forget(rec.Dir)
			o.mem.StopFlatten(rec.ID)
		},
	}
}

// captureMemory writes a running sandbox's memory and VM state into a
// snapshot's VM directory (memimage.Images.Capture).
func (o *Orchestrator) captureMemory(ctx context.Context, s lifecycle.Sandbox, vmDir, diff string) error {
	rec := s.Record()
	return o.mem.Capture(ctx, rec.ID, s.Machine(), rec.Memory, vmDir, diff)
}
