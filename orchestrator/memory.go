package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/vmm/memsnap"
)

// Guest memory is layered: a template's memory file is imported once as a
// sealed base layer; a VM restored from a memory image maps its flattened
// file privately, so the pages it writes are its own anonymous pages, and a
// pause or snapshot captures exactly those as one more sealed layer
// (memsnap.CaptureDiff) next to a VM state without RAM (deviceSnapshotter).
// The next restore maps the stack flattened once into the snapshot's
// memory file (memsnap.Materialize), shared by every VM restored from it.
//
// When the VMM cannot write state without RAM, or the VM was not restored
// from a layered image, the VMM's own snapshot carries the memory whole.

// MemoryImage names a layered guest memory image: its sealed LSMT layers,
// bottom first, and the file they flatten to, which VMs map privately.
type MemoryImage struct {
	Layers []string `json:"layers,omitempty"`
	File   string   `json:"file,omitempty"`
}

func (m MemoryImage) layered() bool { return len(m.Layers) > 0 && m.File != "" }

// deviceSnapshotter is the VMM capability to write VM state without RAM.
type deviceSnapshotter interface {
	SnapshotDevices(ctx context.Context, dir string) (*vmm.Snapshot, error)
}

// memoryManifest is the file in a VMM snapshot directory that says its
// memory is layered (absent: the snapshot's own memory file is the image).
const memoryManifest = "memory.json"

// flatMemory is the flattened layered image in a snapshot directory (not
// the VMM's own "memory" file, which may be the image the VM started from).
const flatMemory = "memory.flat"

func readMemoryManifest(vmDir string) (MemoryImage, error) {
	var m MemoryImage
	b, err := os.ReadFile(filepath.Join(vmDir, memoryManifest))
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("memory manifest of %s: %w", vmDir, err)
	}
	return m, nil
}

func writeMemoryManifest(vmDir string, m MemoryImage) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(vmDir, memoryManifest), b, 0o600); err != nil {
		return fmt.Errorf("write memory manifest: %w", err)
	}
	return nil
}

// ensureMemoryBase gives a template's snapshot a layered memory image: its
// memory file (the booted VM's RAM) imported as the base layer.
func (o *Orchestrator) ensureMemoryBase(t *Template) error {
	o.matMu.Lock()
	defer o.matMu.Unlock()
	if _, err := readMemoryManifest(t.Snapshot); err == nil {
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
	return writeMemoryManifest(t.Snapshot, MemoryImage{Layers: []string{base}, File: mem})
}

// restoreMemory returns the memory file to restore vmDir with ("" for the
// snapshot's own), flattening a layered image first if nobody did yet.
func (o *Orchestrator) restoreMemory(ctx context.Context, vmDir string) (MemoryImage, error) {
	m, err := readMemoryManifest(vmDir)
	if errors.Is(err, os.ErrNotExist) {
		return MemoryImage{}, nil
	}
	if err != nil || !m.layered() {
		return MemoryImage{}, fmt.Errorf("memory of %s: %w", vmDir, errors.Join(err, errors.New("empty manifest")))
	}
	o.matMu.Lock()
	defer o.matMu.Unlock()
	if _, err := os.Stat(m.File); err == nil {
		return m, nil
	}
	start := time.Now()
	if err := memsnap.Materialize(ctx, m.Layers, m.File); err != nil {
		return MemoryImage{}, fmt.Errorf("materialize memory of %s: %w", vmDir, err)
	}
	o.log.Info("memory image materialized", "file", m.File, "layers", len(m.Layers), "took", time.Since(start).Round(time.Millisecond))
	return m, nil
}

// captureMemory (VM paused) writes the VM's snapshot into vmDir (see
// captureVM).
func (o *Orchestrator) captureMemory(ctx context.Context, s *instance, vm vmm.Machine, vmDir, diff string) error {
	s.mu.Lock()
	cur, id := s.rec.Memory, s.rec.ID
	s.mu.Unlock()
	return captureVM(ctx, o.log, id, vm, cur, vmDir, diff)
}

// captureVM (VM paused) writes the VM's snapshot into vmDir. With a layered
// memory image cur and a VMM that can leave RAM out, the pages the VM wrote
// become the sealed layer diff on top of cur's layers, and the manifest in
// vmDir lists them (flattened into vmDir/memory.flat later, by
// restoreMemory). Otherwise the VMM's snapshot carries the memory whole.
func captureVM(ctx context.Context, log *slog.Logger, id string, vm vmm.Machine, cur MemoryImage, vmDir, diff string) error {
	ds, ok := vm.(deviceSnapshotter)
	if !ok || !cur.layered() {
		if _, err := vm.Snapshot(ctx, vmDir); err != nil {
			return fmt.Errorf("vm snapshot: %w", err)
		}
		return nil
	}
	parent, err := memsnap.LayerUUID(cur.Layers[len(cur.Layers)-1])
	if err != nil {
		return err
	}
	st, err := memsnap.CaptureDiff(ctx, vm.Info().PID, cur.File, diff, parent, "sandbox "+id)
	if err != nil {
		return fmt.Errorf("capture memory: %w", err)
	}
	if _, err := ds.SnapshotDevices(ctx, vmDir); err != nil {
		_ = os.Remove(diff)
		if !errors.Is(err, vmm.ErrUnsupported) {
			return fmt.Errorf("vm state: %w", err)
		}
		log.Warn("vm state without RAM refused; taking a whole snapshot", "sandbox", id, "err", err)
		_ = os.RemoveAll(vmDir)
		if _, err := vm.Snapshot(ctx, vmDir); err != nil {
			return fmt.Errorf("vm snapshot: %w", err)
		}
		return nil
	}
	log.Info("memory diff captured", "sandbox", id, "pages", st.Pages, "zero_pages", st.ZeroPages,
		"bytes", st.Bytes, "took", st.Took.Round(time.Millisecond))
	layers := append(append([]string{}, cur.Layers...), diff)
	return writeMemoryManifest(vmDir, MemoryImage{Layers: layers, File: filepath.Join(vmDir, flatMemory)})
}

// adoptMemory rewrites the manifest of a VMM snapshot directory copied from
// owner's into vmDir: layers under owner are hard-linked into dir, and the
// flattened file is vmDir's own.
func adoptMemory(vmDir, owner, dir string) error {
	m, err := readMemoryManifest(vmDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if m.Layers, err = adoptLayers(m.Layers, owner, dir); err != nil {
		return err
	}
	m.File = filepath.Join(vmDir, flatMemory)
	return writeMemoryManifest(vmDir, m)
}
