package orchestrator

import (
	"errors"
	"os"
	"time"

	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/vmm/memsnap"
)

// A memory image's working set is recorded once, from the first VM that
// restores from the image after it has run workingSetAfter, and stored next
// to the image's file; every later restore from that file reads it ahead
// into the page cache before the VMM starts (Options.Prefetch). It is a
// hint: recording or prefetching failures are logged and cost nothing else.

// workingSetAfter is how long a VM runs before its touched pages are taken
// as the image's working set: the guest's wake-up, the agent's first
// answers.
const workingSetAfter = 3 * time.Second

// prefetchMemory reads file's working set ahead, when one is stored.
func (o *Orchestrator) prefetchMemory(file string) {
	if !o.cfg.Prefetch || file == "" {
		return
	}
	n, err := memsnap.Prefetch(file)
	switch {
	case errors.Is(err, memsnap.ErrNoWorkingSet):
	case err != nil:
		o.log.Warn("prefetch memory working set (ignored)", "file", file, "err", err)
	default:
		o.log.Debug("memory working set prefetched", "file", file, "bytes", n)
	}
}

// recordWorkingSet records file's working set from vm in the background,
// unless it has one.
func (o *Orchestrator) recordWorkingSet(id string, vm vmm.Machine, file string) {
	if !o.cfg.Prefetch || file == "" {
		return
	}
	if _, err := os.Stat(memsnap.WorkingSetPath(file)); err == nil {
		return
	}
	if _, busy := o.recording.LoadOrStore(file, true); busy {
		return
	}
	o.goBackground(func() {
		defer o.recording.Delete(file)
		select {
		case <-o.closing:
			return
		case <-time.After(workingSetAfter):
		}
		ws, err := memsnap.WorkingSet(vm.Info().PID, file)
		if err == nil {
			err = memsnap.WriteWorkingSet(file, ws)
		}
		if err != nil {
			// The VM may be gone (killed, paused) already: the next one records.
			o.log.Debug("record memory working set", "sandbox", id, "file", file, "err", err)
			return
		}
		var bytes int64
		for _, e := range ws {
			bytes += e.Len
		}
		o.log.Info("memory working set recorded", "sandbox", id, "file", file, "extents", len(ws), "bytes", bytes)
	})
}
