package memimage

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/agentenv/agentenv/disk"
	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/vmm/memsnap"
)

// A memory image's working set is recorded once, from the first VM created
// from the image, as soon as its agent answered (the pages a create needs),
// and stored next to the image's file (for a shared device, next to its
// stack's config: Devices.WorkingSetPath); every later restore from that
// image reads it ahead into the page cache while the VMM starts
// (Options.Prefetch; a shared device's is pushed by the storage daemon,
// Devices.Prefetch). It is a hint: recording or prefetching failures are
// logged and cost nothing else.

// Prefetch starts reading file's working set ahead, when one is
// stored, alongside the VMM's start (the reads queue behind one another,
// so issuing them takes a while on a cold cache); wait waits for it.
// remote says the file's stack reads layers the node lacks: its guest
// should wait for the push (sandbox.Memory.Ready), each of its faults
// being a fetch otherwise; on local layers the guest's own faults cost no
// more than the push, which runs beside it.
func (im *Images) Prefetch(file string) (wait func(), remote bool) {
	remote = disk.IsDevice(file) && im.cfg.Devices != nil && im.cfg.Devices.Remote(context.Background(), file)
	if file == "" || !remote && !im.prefetches(file) {
		return func() {}, false
	}
	prefetch := memsnap.Prefetch
	if disk.IsDevice(file) {
		prefetch = func(file string) (int64, error) { return im.cfg.Devices.Prefetch(context.Background(), file) }
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		start := time.Now()
		n, err := prefetch(file)
		im.prefetched.Add(n)
		switch {
		case errors.Is(err, memsnap.ErrNoWorkingSet):
		case err != nil:
			im.log.Warn("prefetch memory working set (ignored)", "file", file, "err", err)
		case remote:
			im.log.Info("memory working set pushed ahead of the guest", "file", file, "bytes", n, "took", time.Since(start).Round(time.Millisecond))
		default:
			im.log.Debug("memory working set prefetched", "file", file, "bytes", n)
		}
	}()
	return func() { <-done }, remote
}

// prefetches reports whether the node reads file's working set ahead
// (Options.Prefetch; a device's only with Devices).
func (im *Images) prefetches(file string) bool {
	return im.cfg.Prefetch && (!disk.IsDevice(file) || im.cfg.Devices != nil)
}

// RecordWorkingSet records file's working set from vm in the background,
// unless it has one.
func (im *Images) RecordWorkingSet(id string, vm vmm.Machine, file string) {
	if !im.cfg.Prefetch || file == "" {
		return
	}
	path := memsnap.WorkingSetPath(file)
	if disk.IsDevice(file) {
		if im.cfg.Devices == nil {
			return
		}
		var err error
		if path, err = im.cfg.Devices.WorkingSetPath(context.Background(), file); err != nil {
			im.log.Debug("no working set for a memory device", "sandbox", id, "file", file, "err", err)
			return
		}
	}
	if _, err := os.Stat(path); err == nil {
		return
	}
	if _, busy := im.recording.LoadOrStore(path, true); busy {
		return
	}
	im.cfg.Background(func() {
		defer im.recording.Delete(path)
		ws, err := memsnap.WorkingSet(vm.Info().PID, file)
		if err == nil {
			err = memsnap.WriteWorkingSetTo(path, file, ws)
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
		im.log.Info("memory working set recorded", "sandbox", id, "file", file, "path", path, "extents", len(ws), "bytes", bytes)
	})
}
