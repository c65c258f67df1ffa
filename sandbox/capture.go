package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/vmm/memsnap"
)

// deviceSnapshotter is the VMM capability to write VM state without RAM.
type deviceSnapshotter interface {
	SnapshotDevices(ctx context.Context, dir string) (*vmm.Snapshot, error)
}

// CapturePause (VM paused) writes a pause's snapshot of the sandbox r
// describes, durably: the VMM state and memory of generation r.Gen into
// its own directory (a leftover of an interrupted pause is replaced), all
// fsynced. On failure nothing of it is left. Pause and recovery's pause of
// an adopted VM share it. beforeState (nil: none) runs before the VMM
// writes its state (see CaptureVM).
func CapturePause(ctx context.Context, log *slog.Logger, r Record, vm vmm.Machine, beforeState func() error) (string, error) {
	snapDir := filepath.Join(r.Dir, fmt.Sprintf("snapshot-%d", r.Gen))
	if snapDir == r.Snapshot {
		return "", fmt.Errorf("capture %s: snapshot directory of generation %d already in use", r.ID, r.Gen)
	}
	_ = os.RemoveAll(snapDir)
	diff := filepath.Join(r.Dir, fmt.Sprintf("mem-%d.lsmt", r.Gen))
	cur := r.Memory
	if r.ColdBoot {
		cur = snapshot.MemoryImage{} // a booted VM maps no image, whatever a resume's record still says
	}
	err := CaptureVM(ctx, log, r.ID, vm, cur, snapDir, diff, beforeState)
	if err == nil {
		err = atomicfile.SyncTree(snapDir)
	}
	if err != nil {
		_ = os.RemoveAll(snapDir)
		return "", fmt.Errorf("snapshot: %w", err)
	}
	return snapDir, nil
}

// CaptureVM (VM paused) writes the VM's snapshot into vmDir. With a layered
// memory image cur and a VMM that can leave RAM out, the pages the VM wrote
// become the sealed layer diff on top of cur's layers, then the VM state is
// written, and the manifest in vmDir lists the layers (flattened into
// vmDir/memory.flat later). Otherwise the VMM's snapshot carries the memory
// whole. beforeState (nil: none) runs before the VMM writes its state, and
// its error ends the capture: writing state drains the VM's drives, so a
// pause has it wait for the disks' seal, which may have taken the storage
// daemon down (the drain would then wait out the NBD reconnect delay and
// fail the guest's I/O); reading the memory diff involves neither.
func CaptureVM(ctx context.Context, log *slog.Logger, id string, vm vmm.Machine, cur snapshot.MemoryImage, vmDir, diff string, beforeState func() error) error {
	if beforeState == nil {
		beforeState = func() error { return nil }
	}
	ds, ok := vm.(deviceSnapshotter)
	if !ok || !cur.Layered() {
		return wholeSnapshot(ctx, vm, vmDir, beforeState)
	}
	parent, err := memsnap.LayerUUID(cur.Layers[len(cur.Layers)-1])
	if err != nil {
		return err
	}
	st, err := memsnap.CaptureDiff(ctx, vm.Info().PID, cur.File, diff, parent, "sandbox "+id)
	if err != nil {
		return fmt.Errorf("capture memory: %w", err)
	}
	if err := beforeState(); err != nil {
		_ = os.Remove(diff)
		return fmt.Errorf("before vm state: %w", err)
	}
	if _, err := ds.SnapshotDevices(ctx, vmDir); err != nil {
		_ = os.Remove(diff)
		if !errors.Is(err, vmm.ErrUnsupported) {
			return fmt.Errorf("vm state: %w", err)
		}
		log.Warn("vm state without RAM refused; taking a whole snapshot", "sandbox", id, "err", err)
		_ = os.RemoveAll(vmDir)
		return wholeSnapshot(ctx, vm, vmDir, func() error { return nil })
	}
	log.Info("memory diff captured", "sandbox", id, "pages", st.Pages, "zero_pages", st.ZeroPages,
		"bytes", st.Bytes, "took", st.Took.Round(time.Millisecond))
	layers := append(append([]string{}, cur.Layers...), diff)
	if err := snapshot.WriteMemoryManifest(vmDir, snapshot.MemoryImage{Layers: layers, File: filepath.Join(vmDir, snapshot.FlatMemory), Base: cur.Base}); err != nil {
		return err
	}
	captureWorkingSet(log, id, vm, cur.File, vmDir)
	return nil
}

// MaxCapturedWorkingSet bounds the working set a capture records: the
// next restore of the snapshot on a node without its layers waits for the
// push of all of it.
const MaxCapturedWorkingSet = 256 << 20

// captureWorkingSet records, as the new stack's working set, the pages of
// memFile the paused VM holds (those it touched since its restore: what
// its resume will touch first, up to MaxCapturedWorkingSet in guest
// address order). A hint: a failure is logged and costs only the push.
func captureWorkingSet(log *slog.Logger, id string, vm vmm.Machine, memFile, vmDir string) {
	ws, err := memsnap.WorkingSet(vm.Info().PID, memFile)
	if err == nil {
		ws = memsnap.Cap(ws, MaxCapturedWorkingSet)
		err = memsnap.WriteWorkingSetTo(filepath.Join(vmDir, snapshot.WorkingSetFile), memFile, ws)
	}
	if err != nil {
		log.Warn("record the working set of a capture (its restores go without)", "sandbox", id, "err", err)
		return
	}
	log.Info("working set of a capture recorded", "sandbox", id, "extents", len(ws), "bytes", memsnap.Bytes(ws))
}

// wholeSnapshot has the VMM write its snapshot, memory included, into
// vmDir once beforeState allows it.
func wholeSnapshot(ctx context.Context, vm vmm.Machine, vmDir string, beforeState func() error) error {
	if err := beforeState(); err != nil {
		return fmt.Errorf("before vm snapshot: %w", err)
	}
	if _, err := vm.Snapshot(ctx, vmDir); err != nil {
		return fmt.Errorf("vm snapshot: %w", err)
	}
	return nil
}

// DropMemoryLayers removes the memory layers a sandbox's directory holds
// (its pauses' diffs and their merges): after a filesystem-only pause it
// keeps no memory image. Snapshots taken from it hold their own links.
func DropMemoryLayers(dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if n := e.Name(); strings.HasPrefix(n, "mem-") && strings.HasSuffix(n, ".lsmt") {
			_ = os.Remove(filepath.Join(dir, n))
		}
	}
}
