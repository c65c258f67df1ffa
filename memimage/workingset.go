package memimage

import (
	"errors"
	"os"

	"github.com/agentenv/agentenv/disk"
	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/vmm/memsnap"
)

// A memory image's working set is recorded once, from the first VM created
// from the image, as soon as its agent answered (the pages a create needs),
// and stored next to the image's file; every later restore from that file
// reads it ahead into the page cache while the VMM starts
// (Options.Prefetch). It is a hint: recording or prefetching failures are
// logged and cost nothing else.

// Prefetch starts reading file's working set ahead, when one is
// stored, alongside the VMM's start (the reads queue behind one another,
// so issuing them takes a while on a cold cache); wait waits for it.
func (im *Images) Prefetch(file string) (wait func()) {
	if !im.cfg.Prefetch || file == "" || disk.IsDevice(file) {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		n, err := memsnap.Prefetch(file)
		switch {
		case errors.Is(err, memsnap.ErrNoWorkingSet):
		case err != nil:
			im.log.Warn("prefetch memory working set (ignored)", "file", file, "err", err)
		default:
			im.log.Debug("memory working set prefetched", "file", file, "bytes", n)
		}
	}()
	return func() { <-done }
}

// RecordWorkingSet records file's working set from vm in the background,
// unless it has one.
func (im *Images) RecordWorkingSet(id string, vm vmm.Machine, file string) {
	// A working set is kept next to its file: none for a memory device.
	if !im.cfg.Prefetch || file == "" || disk.IsDevice(file) {
		return
	}
	if _, err := os.Stat(memsnap.WorkingSetPath(file)); err == nil {
		return
	}
	if _, busy := im.recording.LoadOrStore(file, true); busy {
		return
	}
	im.cfg.Background(func() {
		defer im.recording.Delete(file)
		ws, err := memsnap.WorkingSet(vm.Info().PID, file)
		if err == nil {
			err = memsnap.WriteWorkingSet(file, ws)
		}
		if err != nil {
			// The VM may be gone (killed, paused) already: the next one records.
			im.log.Debug("record memory working set", "sandbox", id, "file", file, "err", err)
			return
		}
		var bytes int64
		for _, e := range ws {
			bytes += e.Len
		}
		im.log.Info("memory working set recorded", "sandbox", id, "file", file, "extents", len(ws), "bytes", bytes)
	})
}
