package orchestrator

import (
	"context"
	"errors"
	"fmt"

	"github.com/agentenv/agentenv/internal/cpulist"
	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/vmm"
)

// Pinning a sandbox's vCPUs to host CPUs. The pin list is the sandbox's
// (its record's CPUPin): it is set on the running VMM's vCPU threads at
// once, and on every new VMM of the sandbox (a resume) as it starts. A
// fork's or a snapshot's sandbox starts unpinned: pinning places one
// sandbox on a node's CPUs, and copies of it pinned to the same CPUs would
// crowd them. After a node restart the adopted VMM is pinned again from the
// record, which is what the record says also when the restart cut a pin
// change short between the threads and the record.

// vcpuThreader is a machine that names its vCPUs' host threads (vmm/qemu's
// machines); others cannot be pinned.
type vcpuThreader interface {
	VCPUThreads(ctx context.Context) ([]int, error)
}

// fpPinApplied: the running VMM's vCPU threads have the new affinity, the
// record still has the old list (an adopt re-applies the recorded one).
var fpPinApplied = failpoint.New("orchestrator/cpupin/applied")

// VCPUThread is one vCPU's host thread and its CPU affinity now.
type VCPUThread struct {
	VCPU     int
	ThreadID int
	CPUs     string
}

// CPUPinning is a sandbox's pin list (empty: not pinned), its vCPU count
// and, while its VMM runs, its vCPUs' threads.
type CPUPinning struct {
	Pin     string
	VCPUs   int
	Threads []VCPUThread
}

// PinCPUs pins the sandbox's vCPUs to the host CPUs of list (cpulist
// syntax; empty removes the pinning: the vCPUs may run on every CPU aenvd
// may). A list that does not parse or names a CPU aenvd cannot use is
// ErrInvalid; a VMM that cannot be pinned is vmm.ErrUnsupported. A paused
// sandbox keeps the list for its resume.
func (o *Orchestrator) PinCPUs(ctx context.Context, id, list string) (CPUPinning, error) {
	pin, err := checkPin(list)
	if err != nil {
		return CPUPinning{}, err
	}
	s, err := o.lockOp(id)
	if err != nil {
		return CPUPinning{}, err
	}
	defer s.op.Unlock()
	s.mu.Lock()
	m := s.machine()
	s.mu.Unlock()
	if m != nil {
		if err := applyPin(ctx, m, pin); err != nil {
			return CPUPinning{}, fmt.Errorf("sandbox %s: pin vcpus to %q: %w", id, list, err)
		}
		if err := fpPinApplied.Inject(); err != nil {
			return CPUPinning{}, err
		}
	}
	if err := o.update(s, func(r *sandbox.Record) { r.CPUPin = pin.String() }); err != nil {
		return CPUPinning{}, fmt.Errorf("sandbox %s: record cpu pinning: %w", id, err)
	}
	return o.pinning(ctx, s)
}

// CPUPinning describes the sandbox's pinning.
func (o *Orchestrator) CPUPinning(ctx context.Context, id string) (CPUPinning, error) {
	s, err := o.lockOp(id)
	if err != nil {
		return CPUPinning{}, err
	}
	defer s.op.Unlock()
	return o.pinning(ctx, s)
}

// pinning describes s (op held).
func (o *Orchestrator) pinning(ctx context.Context, s *instance) (CPUPinning, error) {
	s.mu.Lock()
	p := CPUPinning{Pin: s.rec.CPUPin, VCPUs: s.rec.VCPUs}
	m := s.machine()
	s.mu.Unlock()
	if m == nil {
		return p, nil
	}
	t, ok := m.(vcpuThreader)
	if !ok {
		return p, nil
	}
	tids, err := t.VCPUThreads(ctx)
	if err != nil {
		return p, fmt.Errorf("sandbox %s: %w", s.rec.ID, err)
	}
	for i, tid := range tids {
		aff, err := cpulist.Affinity(tid)
		if err != nil {
			return p, fmt.Errorf("sandbox %s: vcpu %d: %w", s.rec.ID, i, err)
		}
		p.Threads = append(p.Threads, VCPUThread{VCPU: i, ThreadID: tid, CPUs: aff.String()})
	}
	return p, nil
}

// checkPin parses list and checks it against the CPUs aenvd may use.
func checkPin(list string) (cpulist.List, error) {
	pin, err := cpulist.Parse(list)
	if err != nil {
		return pin, fmt.Errorf("%w: %w", err, ErrInvalid)
	}
	avail, err := cpulist.Available()
	if err != nil {
		return pin, err
	}
	if err := pin.Check(avail); err != nil {
		return pin, fmt.Errorf("%w: %w", err, ErrInvalid)
	}
	return pin, nil
}

// applyPin sets the affinity of m's vCPU threads to pin, or to every CPU
// aenvd may use when pin is empty (the affinity a VMM starts with).
func applyPin(ctx context.Context, m vmm.Machine, pin cpulist.List) error {
	t, ok := m.(vcpuThreader)
	if !ok {
		return fmt.Errorf("vcpu pinning of a %s machine: %w", m.Info().Driver, vmm.ErrUnsupported)
	}
	if pin.Empty() {
		avail, err := cpulist.Available()
		if err != nil {
			return err
		}
		pin = avail
	}
	tids, err := t.VCPUThreads(ctx)
	if err != nil {
		return err
	}
	for i, tid := range tids {
		if err := cpulist.SetAffinity(tid, pin); err != nil {
			return fmt.Errorf("vcpu %d: %w", i, err)
		}
	}
	return nil
}

// repin sets the recorded pin list rec.CPUPin on a new VMM of the sandbox
// (adopted false: an empty list needs nothing, a VMM starts with aenvd's
// affinity) or on one adopted after a restart (adopted true: also an empty
// list, since a restart between the threads' change and the record leaves
// them pinned to a list the record does not name). A list this node no
// longer can honour (a CPU went offline since) leaves the VMM as it is with
// a warning rather than failing the sandbox's resume: the record keeps the
// list, GET shows the threads' affinity.
func (o *Orchestrator) repin(ctx context.Context, rec sandbox.Record, m vmm.Machine, adopted bool) {
	if rec.CPUPin == "" {
		if _, ok := m.(vcpuThreader); !adopted || !ok {
			return
		}
	}
	pin, err := checkPin(rec.CPUPin)
	if err == nil {
		err = applyPin(ctx, m, pin)
	}
	if err != nil {
		if !errors.Is(err, context.Canceled) {
			o.log.Warn("cannot pin the sandbox's vcpus again", "sandbox", rec.ID, "pin", rec.CPUPin, "err", err)
		}
		return
	}
	o.log.Debug("vcpus pinned", "sandbox", rec.ID, "pin", rec.CPUPin, "adopted", adopted)
}
