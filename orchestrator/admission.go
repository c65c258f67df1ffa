package orchestrator

import (
	"context"

	"github.com/agentenv/agentenv/admission"
	"github.com/agentenv/agentenv/sandbox"
)

// Admitter decides whether the node takes a call (admission.Controller).
// usage is called under the admitter's lock; release ends the call's
// reservation once its sandboxes count in usage, or it failed.
type Admitter interface {
	Admit(ctx context.Context, req admission.Request, usage func() admission.Usage) (release func(), err error)
}

// admit asks Options.Admission about a create or resume of a sandbox of
// memMiB, or a fork of forkChildren children (memMiB 0); without an
// admitter every call is admitted.
func (o *Orchestrator) admit(ctx context.Context, op string, memMiB, forkChildren int) (release func(), err error) {
	if o.cfg.Admission == nil {
		return func() {}, nil
	}
	req := admission.Request{Op: op, MemoryMiB: memMiB, ForkChildren: forkChildren}
	if forkChildren == 0 {
		req.Sandboxes = 1
	}
	return o.cfg.Admission.Admit(ctx, req, o.admissionUsage)
}

// admissionUsage is what the node has committed outside the calls in
// flight: the sandboxes with a VM past their start (a starting or resuming
// one is the admitted call's reservation until it runs) and the warm
// pool's reservations.
func (o *Orchestrator) admissionUsage() admission.Usage {
	var u admission.Usage
	o.mu.Lock()
	list := make([]*instance, 0, len(o.sandboxes))
	for _, s := range o.sandboxes {
		list = append(list, s)
	}
	o.mu.Unlock()
	for _, s := range list {
		s.mu.Lock()
		st, mem := s.rec.State, s.rec.CommittedMemoryMiB()
		s.mu.Unlock()
		switch st {
		case sandbox.Running, sandbox.Pausing, sandbox.Killing:
			u.Sandboxes++
			u.MemoryMiB += mem
		}
	}
	if o.pool != nil {
		u.PoolMiB = o.pool.Stats().ReservedMiB
	}
	return u
}
