// Package memimage manages a node's guest memory images: a template's
// memory file imported once as a sealed base layer, the memory a restored
// VM maps (a flattened file, the base with the layers above it written in,
// or the storage daemon's shared device of the stack), the capture of a
// VM's own pages as one more layer, the background flatten of a paused
// sandbox's image, the merge of a deep layer chain, and the working sets
// read ahead while a VM restores.
//
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
package memimage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/vmm/memsnap"
)

// Devices maps restored VMs' memory from the storage daemon's shared
// device of an image's layer stack (disk.MemoryDevices).
type Devices interface {
	Acquire(ctx context.Context, vmDir string, m snapshot.MemoryImage, holder string) (snapshot.MemoryImage, sandbox.Memory, error)
	// WorkingSetPath is where the working set of a device file is kept.
	WorkingSetPath(ctx context.Context, file string) (string, error)
	// Prefetch pushes a device file's recorded working set into the page
	// cache (memsnap.ErrNoWorkingSet when none is recorded).
	Prefetch(ctx context.Context, file string) (int64, error)
	// Remote reports whether a device file's stack reads layers the node
	// lacks.
	Remote(ctx context.Context, file string) bool
}

// Options configure Images.
type Options struct {
	// Devices, when set, maps restored VMs' memory from shared devices;
	// nil maps files.
	Devices Devices
	// Mu serialises memory imports and materializations; the node's warm
	// pool takes it too when it reuses a memory file.
	Mu *sync.Mutex
	// MaxLayers is the memory chain depth above which a paused sandbox's
	// own layers are merged (default DefaultMaxLayers).
	MaxLayers int
	// Prefetch records each image's working set and reads it ahead while a
	// VM restores from the image (workingset.go).
	Prefetch bool
	// FlattenPaused flattens a paused sandbox's image in the background so
	// that its resume maps one file (flatten.go).
	FlattenPaused bool
	// Background runs f as background work the node waits for at close.
	Background func(f func())
	Logger     *slog.Logger
}

// Images is the node's guest memory images: made once, safe for
// concurrent use.
type Images struct {
	cfg  Options
	log  *slog.Logger
	flat *flattener
	// recording holds the memory files whose working set is being
	// recorded (workingset.go), so two creates do not both record one.
	recording sync.Map
	// prefetched counts the bytes of working sets read ahead or pushed.
	prefetched atomic.Int64
}

// Prefetched is the bytes of working sets read ahead into the page cache
// or pushed by the storage daemon so far.
func (im *Images) Prefetched() int64 { return im.prefetched.Load() }

// New returns the node's memory images.
func New(opts Options) *Images {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Mu == nil {
		opts.Mu = &sync.Mutex{}
	}
	if opts.Background == nil {
		opts.Background = func(f func()) { go f() }
	}
	return &Images{cfg: opts, log: opts.Logger, flat: newFlattener()}
}

// Close stops the background flattens and waits for them; later ones do
// not start.
func (im *Images) Close() { im.flat.close() }

// EnsureBase gives template id's snapshot snapDir a layered memory image:
// its memory file (the booted VM's RAM) imported into dir as the base
// layer.
func (im *Images) EnsureBase(id, snapDir, dir string) error {
	im.cfg.Mu.Lock()
	defer im.cfg.Mu.Unlock()
	if _, err := snapshot.ReadMemoryManifest(snapDir); err == nil {
		return nil
	}
	mem := filepath.Join(snapDir, vmm.SnapshotMemoryFile)
	base := filepath.Join(dir, "mem-0.lsmt")
	st, err := memsnap.ImportFull(context.Background(), mem, base, "template "+id+" memory")
	if err != nil {
		return fmt.Errorf("template %s: import memory: %w", id, err)
	}
	im.log.Info("template memory imported as base layer", "template", id, "pages", st.Pages, "bytes", st.Bytes, "took", st.Took.Round(time.Millisecond))
	if err := fpTemplateImported.Inject(); err != nil {
		return err
	}
	return snapshot.WriteMemoryManifest(snapDir, snapshot.MemoryImage{Layers: []string{base}, File: mem, Base: mem})
}

// Restore returns the memory image a VM restored from vmDir runs on
// ("" File: the snapshot's own) and the layers the restore writes over its
// File. That File is the stack's flattened file when it exists; else, with
// overlay and a base file, the base with the layers above it to write in
// (their pages are all it costs); else the stack flattened now, once, for
// every VM restored from vmDir.
func (im *Images) Restore(ctx context.Context, vmDir string, overlay bool) (snapshot.MemoryImage, []string, error) {
	m, err := snapshot.ReadMemoryManifest(vmDir)
	if errors.Is(err, os.ErrNotExist) {
		return snapshot.MemoryImage{}, nil, nil
	}
	if err != nil || !m.Layered() {
		return snapshot.MemoryImage{}, nil, fmt.Errorf("memory of %s: %w", vmDir, errors.Join(err, errors.New("empty manifest")))
	}
	im.cfg.Mu.Lock()
	defer im.cfg.Mu.Unlock()
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
	im.log.Info("memory image materialized", "file", m.File, "layers", len(m.Layers), "took", time.Since(start).Round(time.Millisecond))
	return m, nil, nil
}

// VMMemory returns the memory image of a VM (named holder) restored from
// vmDir, as the VM maps it, and what the restore gets: with memory devices
// (disk/memory.go) the shared device of the image's stack, held for holder;
// else Restore's file and layers.
func (im *Images) VMMemory(ctx context.Context, vmDir, holder string) (snapshot.MemoryImage, sandbox.Memory, error) {
	if im.cfg.Devices != nil {
		m, err := snapshot.ReadMemoryManifest(vmDir)
		if err == nil && m.Layered() {
			return im.cfg.Devices.Acquire(ctx, vmDir, m, holder)
		}
	}
	m, layers, err := im.Restore(ctx, vmDir, true)
	return m, sandbox.Memory{File: m.File, Layers: layers}, err
}

// Capture (VM paused) writes the snapshot of sandbox id's VM, whose memory
// is cur, into vmDir, its own pages as the layer diff (sandbox.CaptureVM).
func (im *Images) Capture(ctx context.Context, id string, vm vmm.Machine, cur snapshot.MemoryImage, vmDir, diff string) error {
	return sandbox.CaptureVM(ctx, im.log, id, vm, cur, vmDir, diff, nil)
}
