// Package lifecycle holds the verbs of a live sandbox (create, pause,
// resume, kill, the capture of a snapshot and fork) as named stage lists
// in the style of sandbox.Start: each verb runs its stages in order; a
// stage that changes something registers its undo on a stack, and a
// failure before the verb's commit point runs the stack once, newest
// first. After the commit point (the durable "paused" record, the
// "killing" record) what is left is cleanup that recovery redoes, so it is
// logged, never undone.
//
// A verb works on a Sandbox: the orchestrator's registry entry of a
// running sandbox, or a VM recovery adopted after a restart (Adopted). Both
// run the same stages, so a node has one pause and one kill; the stages
// that only make sense while the node serves (the guest's flush, the wait
// for remote layers, the fault points) are skipped for an adopted VM,
// which recovery stops whatever happens.
package lifecycle

import (
	"context"
	"log/slog"

	"github.com/agentenv/agentenv/disk"
	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/store"
	"github.com/agentenv/agentenv/telemetry"
	"github.com/agentenv/agentenv/vmm"
)

// Sandbox is a sandbox as a verb sees it. Its record changes only through
// Transition (the state, sandbox.Journal) and Update and Set (the other
// fields); Record returns a copy.
type Sandbox interface {
	Record() sandbox.Record
	// Machine is the running VMM; nil when there is none.
	Machine() vmm.Machine
	// Slot is the VM's network slot; nil when none (an adopted VM's slot
	// is the network's, released by its start).
	Slot() *network.Slot
	// Adopted reports a VM recovery took over after a restart: its verbs
	// skip the stages of a serving node and stop the VM on failure.
	Adopted() bool
	Transition(to sandbox.State, change func(*sandbox.Record)) error
	// Update persists a change of fields other than the state.
	Update(change func(*sandbox.Record)) error
	// Set changes the in-memory record only (the next write persists it).
	Set(change func(*sandbox.Record))
	// StopVM stops the VMM and releases the slot, clearing the record's
	// pid and slot; idempotent.
	StopVM(ctx context.Context)
	// ReleaseDevices deletes the record's storage devices and clears them.
	ReleaseDevices(ctx context.Context)
}

// Verbs are the node's parts the verbs use.
type Verbs struct {
	Disks *disk.Manager
	Store *store.Store
	// Ops times the verbs (nil: not timed).
	Ops *telemetry.Ops
	Log *slog.Logger
	// DataDir holds the node's snapshots (DataDir/snapshots).
	DataDir string
}

// observe times op (Ops.Observe) when Ops is set, on a serving sandbox.
func (v *Verbs) observe(s Sandbox, op string) (done func(error), lap func(string)) {
	if v.Ops == nil || s.Adopted() {
		return func(error) {}, func(string) {}
	}
	return v.Ops.Observe(op), v.Ops.Stage(op)
}

// undoStack is a verb's cleanup stack: every stage that changed something
// registers how to take it back; run takes them back newest first.
type undoStack struct{ fns []func(context.Context) error }

func (u *undoStack) add(f func(context.Context) error) { u.fns = append(u.fns, f) }

// run undoes every registered stage, newest first, and returns what
// failed; the stack is empty afterwards.
func (u *undoStack) run(ctx context.Context) []error {
	var errs []error
	for i := len(u.fns) - 1; i >= 0; i-- {
		if err := u.fns[i](ctx); err != nil {
			errs = append(errs, err)
		}
	}
	u.fns = nil
	return errs
}

// inject fires fault point p unless s is adopted (recovery fires none).
func inject(s Sandbox, p interface{ Inject() error }) error {
	if s.Adopted() {
		return nil
	}
	return p.Inject()
}
