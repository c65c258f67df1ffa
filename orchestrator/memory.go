package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

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
// (memsnap.CaptureDiff) next to a VM state without RAM (sandbox.CaptureVM).
// The next restore maps the template's memory file (the image's base) and
// gets the layers above it written in (memsnap.WriteLayers); an image
// without a base is flattened once into the snapshot's memory file
// (memsnap.Materialize), shared by every VM restored from it.
//
// When the VMM cannot write state without RAM, or the VM was not restored
// from a layered image, the VMM's own snapshot carries the memory whole.

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
	return sandbox.CaptureVM(ctx, o.log, id, vm, cur, vmDir, diff, nil)
}
