package sandbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/vmm"
)

// The two halves of a pooled start (Spec.Prepare, Spec.Pooled): the stages
// of Start call these where a pooled VM changes what they do.

// checkTwoHalves refuses a spec a pooled start cannot run.
func checkTwoHalves(spec Spec) error {
	switch {
	case spec.Prepare && spec.Pooled != nil:
		return errors.New("start: a VM is either prepared or taken from a pool, not both")
	case (spec.Prepare || spec.Pooled != nil) && spec.Restore == "":
		return errors.New("start: a pooled VM restores a snapshot: Restore is required")
	case spec.Pooled != nil && (spec.Pooled.Machine == nil || spec.Pooled.Slot == nil):
		return errors.New("start: the pooled VM holds no VMM or slot")
	}
	for i, d := range spec.Drives {
		if spec.Pooled != nil && d != nil {
			return fmt.Errorf("start: drive slot %d: a pooled VM was started with its drive slots empty", i+1)
		}
	}
	return nil
}

// pooledSlot is the pooled VM's slot (nil without a pooled VM).
func (v *VM) pooledSlot(spec Spec) *network.Slot {
	if spec.Pooled == nil {
		return nil
	}
	return spec.Pooled.Slot
}

// undoPooled registers the pooled VM's own tear-down (its VMM, its memory
// hold and its control group) for a failed start: until the VMM is loaded and confined
// anew, nothing else stops it.
func (v *VM) undoPooled(spec Spec, undo *cleanup) {
	p := spec.Pooled
	if p == nil {
		return
	}
	undo.add(func(ctx context.Context) {
		if p.Machine.Stop(ctx) == nil {
			p.releaseMemory(ctx) // its memory hold, unless the start took it over
		}
		if p.group != nil {
			_ = p.group.Remove()
		}
	})
}

// checkPooledMemory refuses a pooled VM that maps another memory image
// than the restore needs, and layers on a prepared one (the taker's).
func (v *VM) checkPooledMemory(spec Spec) error {
	switch {
	case spec.Prepare && len(v.memLayers) > 0:
		return errors.New("start: a prepared VM gets its memory layers when it is taken")
	case spec.Pooled != nil && spec.Pooled.Memory != v.Memory:
		return fmt.Errorf("start: the pooled VM maps memory image %q, the restore needs %q", spec.Pooled.Memory, v.Memory)
	}
	return nil
}

// prepare starts the VMM of rc waiting for its state.
func (v *VM) prepare(ctx context.Context, rc vmm.RestoreConfig) (vmm.Machine, error) {
	p, ok := v.deps.Driver.(vmm.Preparer)
	if !ok {
		return nil, fmt.Errorf("prepare: driver %s cannot start a VMM ahead of its restore: %w", v.deps.Driver.Name(), vmm.ErrUnsupported)
	}
	m, err := p.Prepare(ctx, rc)
	if err != nil {
		return nil, fmt.Errorf("prepare: %w", err)
	}
	return m, nil
}

// fpPooledMoved: the pooled VMM's run directory is the start's, its state
// not loaded yet (a recovery that found the VMM there must not take it
// for the sandbox's VM).
var fpPooledMoved = failpoint.New("sandbox/pooled/moved")

// loadPooled moves the pooled VMM's run directory to the start's and loads
// the snapshot's state and memory layers into it.
func (v *VM) loadPooled(ctx context.Context, spec Spec) (vmm.Machine, error) {
	m, ok := spec.Pooled.Machine.(vmm.Prepared)
	if !ok {
		return nil, errors.New("restore: the pooled VM's VMM waits for no state")
	}
	if err := m.Move(spec.RunDir); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	if err := fpPooledMoved.Inject(); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	if err := m.Load(ctx, spec.Restore, v.memLayers, v.memReady != nil); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	return v.runWhenReady(ctx, m)
}

// leavePooledGroup removes the pooled VM's control group once its VMM moved
// into the start's own.
func (v *VM) leavePooledGroup(spec Spec) error {
	if spec.Pooled == nil || spec.Pooled.group == nil {
		return nil
	}
	if err := spec.Pooled.group.Remove(); err != nil {
		return fmt.Errorf("confine vmm: leave the pool's group: %w", err)
	}
	spec.Pooled.group = nil
	return nil
}
