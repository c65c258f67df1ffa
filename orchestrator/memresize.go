package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/agentenv/agentenv/admission"
	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/vmm"
)

// Resizing a running sandbox's memory. The ceiling is the RAM its VM
// starts with (its template's memory); a resize sets a target between
// MinMemoryMiB and the ceiling, which the guest reaches by giving pages to
// its VMM or taking them back (vmm.Resizer, a virtio-balloon device). The
// target is the sandbox's (its record's MemoryTargetMiB): the node's
// admission and /nodes count the sandbox at it, a pause keeps it (the
// balloon's state travels in the VM's state, a cold resume's new VMM is
// given it again), a snapshot and the sandboxes made from it, forks among
// them, carry it. After a node restart the adopted VMM is given the
// recorded target again, which is what the record says also when the
// restart cut a resize short between the VMM and the record.

// MinMemoryMiB is the smallest target a resize takes: below it the guest's
// kernel, agent and page cache would leave a process little to run in.
const MinMemoryMiB = 128

// resizeSettle bounds how long a resize waits for the guest to reach its
// target; resizeStall ends the wait earlier once the guest's memory stopped
// moving (it holds pages it cannot free).
const (
	resizeSettle = 60 * time.Second
	resizeStall  = 3 * time.Second
	resizePoll   = 100 * time.Millisecond
)

// guestReserveMiB is the available memory (free, or page cache it can
// drop) a shrink leaves the guest: the balloon driver takes every page
// that frees up while it is short of its target, and a guest left with
// none hands its next allocation to its OOM killer, which kills the
// process holding the most (measured: a shrink below what a process held
// did, with the reserve it does not).
const guestReserveMiB = 32

// fpResizeApplied: the VMM was given the new target, the record still has
// the old one (an adopt sets the recorded one again).
var fpResizeApplied = failpoint.New("orchestrator/resize/applied")

// SandboxMemory is a sandbox's memory: its ceiling, its target and, while
// its VMM runs, what its guest has now. Complete says whether the guest
// reached the target, or (a resize's answer) the size asked for,
// RequestedMiB.
type SandboxMemory struct {
	CeilingMiB   int
	RequestedMiB int // a resize's answer only
	TargetMiB    int
	ActualMiB    int // 0 when the sandbox does not run
	Complete     bool
}

// ResizeMemory sets a running sandbox's memory target to targetMiB and
// waits (bounded by resizeSettle and ctx) for its guest to reach it or to
// stop moving; the answer says what the guest has then. A shrink is
// partial when the guest holds more than the size asked for leaves it
// (its processes' memory and guestReserveMiB): the target is then what
// it can give (shrinkFloor), or where it stopped plus guestReserveMiB when
// it gave less, and the node counts the sandbox at that. A target outside
// MinMemoryMiB..ceiling is ErrInvalid, a sandbox that does not run
// ErrConflict, a VMM without the capability vmm.ErrUnsupported, a growth
// the node's admission refuses its refusal.
func (o *Orchestrator) ResizeMemory(ctx context.Context, id string, targetMiB int) (SandboxMemory, error) {
	if targetMiB < MinMemoryMiB {
		return SandboxMemory{}, fmt.Errorf("sandbox %s: memory %d MiB is below the minimum of %d MiB: %w", id, targetMiB, MinMemoryMiB, ErrInvalid)
	}
	s, err := o.lockOp(id)
	if err != nil {
		return SandboxMemory{}, err
	}
	defer s.op.Unlock()
	s.mu.Lock()
	rec, m := s.rec, s.machine()
	s.mu.Unlock()
	if targetMiB > rec.MemoryMiB {
		return SandboxMemory{}, fmt.Errorf("sandbox %s: memory %d MiB is outside %d to %d MiB (the RAM its VM started with): %w",
			id, targetMiB, MinMemoryMiB, rec.MemoryMiB, ErrInvalid)
	}
	if rec.State != sandbox.Running || m == nil {
		return SandboxMemory{}, fmt.Errorf("resize sandbox %s: it is %s, a resize needs it running: %w", id, rec.State, ErrConflict)
	}
	r, ok := m.(vmm.Resizer)
	if !ok {
		return SandboxMemory{}, fmt.Errorf("resize sandbox %s: a %s machine: %w", id, m.Info().Driver, vmm.ErrUnsupported)
	}
	release, err := o.admitGrowth(ctx, targetMiB-rec.CommittedMemoryMiB())
	if err != nil {
		return SandboxMemory{}, fmt.Errorf("resize sandbox %s to %d MiB: %w", id, targetMiB, err)
	}
	defer release()
	floor, err := shrinkFloor(ctx, r, targetMiB)
	if err != nil {
		return SandboxMemory{}, fmt.Errorf("resize sandbox %s: %w", id, err)
	}
	set := min(rec.MemoryMiB, max(targetMiB, floor))
	if err := r.SetMemory(ctx, set); err != nil {
		return SandboxMemory{}, fmt.Errorf("resize sandbox %s: %w", id, err)
	}
	if err := fpResizeApplied.Inject(); err != nil {
		return SandboxMemory{}, err
	}
	if err := o.update(s, func(r *sandbox.Record) { r.MemoryTargetMiB = set }); err != nil {
		return SandboxMemory{}, fmt.Errorf("sandbox %s: record memory target: %w", id, err)
	}
	actual, err := settle(ctx, r, set)
	if err != nil {
		return SandboxMemory{}, fmt.Errorf("resize sandbox %s: %w", id, err)
	}
	out := SandboxMemory{CeilingMiB: rec.MemoryMiB, RequestedMiB: targetMiB, TargetMiB: set, ActualMiB: actual, Complete: actual == targetMiB}
	if actual > set {
		out.TargetMiB = min(rec.MemoryMiB, actual+guestReserveMiB)
		if err := r.SetMemory(ctx, out.TargetMiB); err != nil {
			return SandboxMemory{}, fmt.Errorf("resize sandbox %s: settle a partial shrink: %w", id, err)
		}
		if err := o.update(s, func(r *sandbox.Record) { r.MemoryTargetMiB = out.TargetMiB }); err != nil {
			return SandboxMemory{}, fmt.Errorf("sandbox %s: record memory target: %w", id, err)
		}
	}
	o.log.Info("sandbox memory resized", "sandbox", id, "requested_mib", targetMiB, "target_mib", out.TargetMiB, "actual_mib", actual)
	return out, nil
}

// shrinkFloor is the smallest memory the guest can shrink to now while
// keeping guestReserveMiB available: what it has less what it could give
// (vmm.Resizer.Available). 0 when targetMiB does not shrink it.
func shrinkFloor(ctx context.Context, r vmm.Resizer, targetMiB int) (int, error) {
	actual, err := r.Memory(ctx)
	if err != nil || targetMiB >= actual {
		return 0, err
	}
	avail, err := r.Available(ctx)
	if err != nil {
		return 0, err
	}
	return actual - max(0, avail-guestReserveMiB), nil
}

// admitGrowth asks the node's admission for growMiB more guest memory (a
// shrink needs nothing); release ends the reservation, once the record
// counts the new target.
func (o *Orchestrator) admitGrowth(ctx context.Context, growMiB int) (release func(), err error) {
	if growMiB <= 0 || o.cfg.Admission == nil {
		return func() {}, nil
	}
	return o.cfg.Admission.Admit(ctx, admission.Request{Op: "resize", MemoryMiB: growMiB}, o.admissionUsage)
}

// settle polls the guest's memory until it is targetMiB, stopped moving
// for resizeStall, or resizeSettle passed, and returns it.
func settle(ctx context.Context, r vmm.Resizer, targetMiB int) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, resizeSettle)
	defer cancel()
	last, moved := -1, time.Now()
	for {
		actual, err := r.Memory(ctx)
		if err != nil {
			if last >= 0 && errors.Is(err, context.DeadlineExceeded) {
				return last, nil
			}
			return 0, err
		}
		if actual != last {
			last, moved = actual, time.Now()
		}
		if actual == targetMiB || time.Since(moved) >= resizeStall {
			return actual, nil
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return last, nil
			}
			return 0, ctx.Err()
		case <-time.After(resizePoll):
		}
	}
}

// Memory describes a sandbox's memory: ceiling and target from its record,
// the guest's memory now while its VMM runs (and can tell).
func (o *Orchestrator) Memory(ctx context.Context, id string) (SandboxMemory, error) {
	s, err := o.lockOp(id)
	if err != nil {
		return SandboxMemory{}, err
	}
	defer s.op.Unlock()
	s.mu.Lock()
	rec, m := s.rec, s.machine()
	s.mu.Unlock()
	out := SandboxMemory{CeilingMiB: rec.MemoryMiB, TargetMiB: rec.CommittedMemoryMiB()}
	r, ok := m.(vmm.Resizer)
	if m == nil || !ok {
		return out, nil
	}
	actual, err := r.Memory(ctx)
	if errors.Is(err, vmm.ErrUnsupported) {
		return out, nil
	}
	if err != nil {
		return out, fmt.Errorf("sandbox %s: %w", id, err)
	}
	out.ActualMiB, out.Complete = actual, actual == out.TargetMiB
	return out, nil
}

// retarget gives a new VMM of the sandbox the recorded target (a cold
// resume boots with all of its RAM; a restored one has it in its state
// already, and setting it again changes nothing), or one adopted after a
// restart (adopted: also the ceiling when not resized, since a restart
// between the VMM's change and the record leaves the VMM on a target the
// record does not name). A VMM that cannot resize keeps what it has, with
// a warning when the record asks for less.
func (o *Orchestrator) retarget(ctx context.Context, rec sandbox.Record, m vmm.Machine, adopted bool) {
	if rec.MemoryTargetMiB == 0 && !adopted {
		return
	}
	r, ok := m.(vmm.Resizer)
	var err error
	if !ok {
		err = vmm.ErrUnsupported
	} else {
		err = r.SetMemory(ctx, rec.CommittedMemoryMiB())
	}
	switch {
	case err == nil:
		o.log.Debug("memory target set", "sandbox", rec.ID, "target_mib", rec.CommittedMemoryMiB(), "adopted", adopted)
	case errors.Is(err, vmm.ErrUnsupported) && rec.MemoryTargetMiB == 0, errors.Is(err, context.Canceled):
	default:
		o.log.Warn("cannot set the sandbox's memory target again", "sandbox", rec.ID, "target_mib", rec.MemoryTargetMiB, "err", err)
	}
}
