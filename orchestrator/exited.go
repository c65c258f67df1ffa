package orchestrator

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot"
)

// A VMM that ends while its sandbox runs, without a verb asking it to (it
// crashed or was killed, or the guest touched memory that could not be read
// and the mapping faulted), takes the guest's memory with it; the disks
// are still there. Each running VM has a watcher that waits for its VMM's
// end: when the VM is still its sandbox's, the sandbox is paused
// filesystem-only (lifecycle.Verbs.PauseExited) with the reason in its
// record (Failure, shown by the API) and the log, naming the memory layer
// whose reads failed when there was one. A resume then cold-boots it from
// its disk. The watchers stop with the node (Shutdown, Close): a VMM that
// ends after that is the next start's (recovery does the same there).

// watchVM starts the watcher of s's running VM vm.
func (o *Orchestrator) watchVM(s *instance, vm *sandbox.VM) {
	s.mu.Lock()
	id := s.rec.ID
	s.mu.Unlock()
	// The handle is read here, under the operation lock its caller holds:
	// a stop clears vm.Machine later, from another goroutine.
	m, ctx := vm.Machine, o.watchCtx
	if m == nil {
		return
	}
	o.goBackground(func() {
		err := m.Wait(ctx)
		if ctx.Err() != nil {
			return
		}
		o.vmExited(id, vm, err)
	})
}

// vmExited handles the end of vm's VMM: nothing when a verb stopped it (vm
// is no longer the sandbox's by the time the verb lets go of it).
func (o *Orchestrator) vmExited(id string, vm *sandbox.VM, waitErr error) {
	s, err := o.lockOp(id)
	if err != nil {
		return
	}
	defer s.op.Unlock()
	s.mu.Lock()
	mine, rec := s.vm == vm, s.rec
	s.mu.Unlock()
	if !mine || rec.State != sandbox.Running {
		return
	}
	why := "the VMM exited"
	if waitErr != nil {
		why = fmt.Sprintf("the VMM exited: %v", waitErr)
	}
	why = o.withLayerFailures(why, rec.Memory.Layers)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	o.stopTimer(s)
	if err := o.verbs.PauseExited(ctx, o.live(s), why); err != nil {
		o.log.Error("keep the disks of a sandbox whose VMM ended (the next start retries)", "sandbox", id, "err", err)
		return
	}
	o.maybeCompact(o.live(s).Record())
}

// withLayerFailures appends to why the failed reads of the memory layers
// a VM maps (the LayerFailure hooks), so the layer's digest is named.
func (o *Orchestrator) withLayerFailures(why string, layers []string) string {
	var failed []string
	for _, h := range o.registered() {
		if h.LayerFailure == nil {
			continue
		}
		for _, l := range layers {
			if err := h.LayerFailure(l); err != nil && !slices.Contains(failed, err.Error()) {
				failed = append(failed, err.Error())
			}
		}
	}
	if len(failed) == 0 {
		return why
	}
	return why + "; guest memory could not be read: " + strings.Join(failed, "; ")
}

// resumeFailure names, in the error of a failed resume of s and in its
// record, the memory layers whose reads failed (nothing when none did:
// the error says enough).
func (o *Orchestrator) resumeFailure(s *instance, err error) error {
	s.mu.Lock()
	rec := s.rec
	s.mu.Unlock()
	layers := rec.Memory.Layers
	if m, err := snapshot.ReadMemoryManifest(rec.Snapshot); rec.Snapshot != "" && err == nil {
		layers = append(slices.Clone(layers), m.Layers...) // what the restore mapped
	}
	why := o.withLayerFailures("", layers)
	if why == "" {
		return err
	}
	why = strings.TrimPrefix(why, "; ")
	if uerr := o.update(s, func(r *sandbox.Record) { r.Failure = "resume failed: " + why }); uerr != nil {
		o.log.Warn("record why a resume failed", "sandbox", rec.ID, "err", uerr)
	}
	return fmt.Errorf("%w (%s)", err, why)
}
