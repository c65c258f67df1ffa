package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/template"

	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/vmm/memsnap"
)

// Guest memory is layered: a template's memory file is imported once as a
// sealed base layer; a VM restored from a memory image maps its flattened
// file privately, so the pages it writes are its own anonymous pages, and a
// pause or snapshot captures exactly those as one more sealed layer
// (memsnap.CaptureDiff) next to a VM state without RAM (deviceSnapshotter).
// The next restore maps the template's memory file (the image's base) and
// gets the layers above it written in (memsnap.WriteLayers); an image
// without a base is flattened once into the snapshot's memory file
// (memsnap.Materialize), shared by every VM restored from it.
//
// When the VMM cannot write state without RAM, or the VM was not restored
// from a layered image, the VMM's own snapshot carries the memory whole.

// deviceSnapshotter is the VMM capability to write VM state without RAM.
type deviceSnapshotter interface {
	SnapshotDevices(ctx context.Context, dir string) (*vmm.Snapshot, error)
}

// ensureMemoryBase gives a template's snapshot a layered memory image: its
// memory file (the booted VM's RAM) imported as the base layer.
func (o *Orchestrator) ensureMemoryBase(t *template.Template) error {
	o.matMu.Lock()
	defer o.matMu.Unlock()
	if _, err := snapshot.ReadMemoryManifest(t.Snapshot); err == nil {
		return nil
	}
	mem := filepath.Join(t.Snapshot, vmm.SnapshotMemoryFile)
	base := filepath.Join(t.Dir, "mem-0.lsmt")
	st, err := memsnap.ImportFull(context.Background(), mem, base, "template "+t.ID+" memory")
	if err != nil {
		return fmt.Errorf("template %s: import memory: %w", t.ID, err)
	}
	o.log.Info("template memory imported as base layer", "template", t.ID, "pages", st.Pages, "bytes", st.Bytes, "took", st.Took.Round(time.Millisecond))
	if err := fpTemplateImported.Inject(); err != nil {
		return err
	}
	return snapshot.WriteMemoryManifest(t.Snapshot, snapshot.MemoryImage{Layers: []string{base}, File: mem, Base: mem})
}

// restoreMemory returns the memory image a VM restored from vmDir runs on
// ("" File: the snapshot's own) and the layers the restore writes over its
// File. That File is the stack's flattened file when it exists; else, with
// overlay and a base file, the base with the layers above it to write in
// (their pages are all it costs); else the stack flattened now, once, for
// every VM restored from vmDir.
func (o *Orchestrator) restoreMemory(ctx context.Context, vmDir string, overlay bool) (snapshot.MemoryImage, []string, error) {
	m, err := snapshot.ReadMemoryManifest(vmDir)
	if errors.Is(err, os.ErrNotExist) {
		return snapshot.MemoryImage{}, nil, nil
	}
	if err != nil || !m.Layered() {
		return snapshot.MemoryImage{}, nil, fmt.Errorf("memory of %s: %w", vmDir, errors.Join(err, errors.New("empty manifest")))
	}
	o.matMu.Lock()
	defer o.matMu.Unlock()
	if _, err := os.Stat(m.File); err == nil {
		return m, nil, nil
	}
	if _, err := os.Stat(m.Base); overlay && m.Base != "" && err == nil && len(m.Layers) > 1 {
		running := m
		running.File = m.Base
		return running, m.Layers[1:], nil
	}
	start := time.Now()
	if err := memsnap.Materialize(ctx, m.Layers, m.File); err != nil {
		return snapshot.MemoryImage{}, nil, fmt.Errorf("materialize memory of %s: %w", vmDir, err)
	}
	o.log.Info("memory image materialized", "file", m.File, "layers", len(m.Layers), "took", time.Since(start).Round(time.Millisecond))
	return m, nil, nil
}

// vmMemory returns the memory image of a VM (named holder) restored from
// vmDir, as the VM maps it, and what the restore gets: with memory devices
// (disk/memory.go) the shared device of the image's stack, held for holder;
// else restoreMemory's file and layers.
func (o *Orchestrator) vmMemory(ctx context.Context, vmDir, holder string) (snapshot.MemoryImage, sandbox.Memory, error) {
	if o.memDev != nil {
		m, err := snapshot.ReadMemoryManifest(vmDir)
		if err == nil && m.Layered() {
			return o.memDev.Acquire(ctx, vmDir, m, holder)
		}
	}
	m, layers, err := o.restoreMemory(ctx, vmDir, true)
	return m, sandbox.Memory{File: m.File, Layers: layers}, err
}

// captureMemory (VM paused) writes the VM's snapshot into vmDir (see
// captureVM).
func (o *Orchestrator) captureMemory(ctx context.Context, s *instance, vm vmm.Machine, vmDir, diff string) error {
	s.mu.Lock()
	cur, id := s.rec.Memory, s.rec.ID
	s.mu.Unlock()
	return captureVM(ctx, o.log, id, vm, cur, vmDir, diff, nil)
}

// capturePause (VM paused) writes a pause's snapshot of the sandbox r
// describes, durably: the VMM state and memory of generation r.Gen into
// its own directory (a leftover of an interrupted pause is replaced), all
// fsynced. On failure nothing of it is left. Pause and recovery's pause of
// an adopted VM share it. beforeState (nil: none) runs before the VMM
// writes its state (see captureVM).
func capturePause(ctx context.Context, log *slog.Logger, r Record, vm vmm.Machine, beforeState func() error) (string, error) {
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
	err := captureVM(ctx, log, r.ID, vm, cur, snapDir, diff, beforeState)
	if err == nil {
		err = atomicfile.SyncTree(snapDir)
	}
	if err != nil {
		_ = os.RemoveAll(snapDir)
		return "", fmt.Errorf("snapshot: %w", err)
	}
	return snapDir, nil
}

// captureVM (VM paused) writes the VM's snapshot into vmDir. With a layered
// memory image cur and a VMM that can leave RAM out, the pages the VM wrote
// become the sealed layer diff on top of cur's layers, then the VM state is
// written, and the manifest in vmDir lists the layers (flattened into
// vmDir/memory.flat later). Otherwise the VMM's snapshot carries the memory
// whole. beforeState (nil: none) runs before the VMM writes its state, and
// its error ends the capture: writing state drains the VM's drives, so a
// pause has it wait for the disks' seal, which may have taken the storage
// daemon down (the drain would then wait out the NBD reconnect delay and
// fail the guest's I/O); reading the memory diff involves neither.
func captureVM(ctx context.Context, log *slog.Logger, id string, vm vmm.Machine, cur snapshot.MemoryImage, vmDir, diff string, beforeState func() error) error {
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
	return snapshot.WriteMemoryManifest(vmDir, snapshot.MemoryImage{Layers: layers, File: filepath.Join(vmDir, snapshot.FlatMemory), Base: cur.Base})
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
