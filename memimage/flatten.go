package memimage

import (
	"context"
	"errors"
	"os"
	"sync"
	"time"

	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/vmm/memsnap"
)

// A paused sandbox's memory image is the template's memory file (the base)
// with the layers its pauses captured above it. Resumed as it is, the new
// VM gets those layers written into its RAM before it runs: their size is
// the resume's cost (280 MiB took ~0.7 s). So after a pause the image is
// flattened into the snapshot's own file in the background, while nothing
// waits on it; a resume that comes later maps that one file, as a create
// maps its template's, and its guest reads the pages as it touches them. A
// resume (or kill) that comes first cancels the flatten and goes on
// without it. The flat file is derived data written atomically: a crash
// leaves it whole or absent, and the manifest names it either way.
//
// It costs the disk space of the flat file (the image's non-zero pages)
// per paused sandbox and the flatten's I/O: Options.FlattenPaused turns
// it off.

// flattener runs the background flattens of paused sandboxes' memory, at
// most one per sandbox and one at a time (a burst of pauses, or a restart
// with many paused sandboxes, queues them instead of competing for the
// disk), and stops them on demand.
type flattener struct {
	ctx    context.Context // canceled by close
	cancel context.CancelFunc
	wg     sync.WaitGroup // the running flattens
	turn   chan struct{}  // held by the one flatten writing

	mu   sync.Mutex
	jobs map[string]*flattenJob // by sandbox id; guarded by mu
}

// flattenJob is one running flatten.
type flattenJob struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when the flatten returned
}

func newFlattener() *flattener {
	ctx, cancel := context.WithCancel(context.Background())
	return &flattener{ctx: ctx, cancel: cancel, turn: make(chan struct{}, 1), jobs: map[string]*flattenJob{}}
}

// start runs f for sandbox id in the background (f's context ends with
// stop or close). A flatten of id already running is stopped first.
func (fl *flattener) start(id string, f func(ctx context.Context)) {
	fl.stop(id)
	fl.mu.Lock()
	defer fl.mu.Unlock()
	if fl.ctx.Err() != nil {
		return // closed: no Add after close's Wait began
	}
	ctx, cancel := context.WithCancel(fl.ctx)
	j := &flattenJob{cancel: cancel, done: make(chan struct{})}
	fl.jobs[id] = j
	fl.wg.Add(1)
	go func() {
		defer fl.wg.Done()
		defer close(j.done)
		defer cancel()
		select {
		case fl.turn <- struct{}{}:
			f(ctx)
			<-fl.turn
		case <-ctx.Done():
		}
		fl.mu.Lock()
		if fl.jobs[id] == j {
			delete(fl.jobs, id)
		}
		fl.mu.Unlock()
	}()
}

// stop cancels the flatten of sandbox id, if one runs, and waits for it to
// return (a canceled flatten leaves no file behind).
func (fl *flattener) stop(id string) {
	fl.mu.Lock()
	j := fl.jobs[id]
	delete(fl.jobs, id)
	fl.mu.Unlock()
	if j != nil {
		j.cancel()
		<-j.done
	}
}

// close cancels every flatten and waits for them; start does nothing
// afterwards.
func (fl *flattener) close() {
	fl.mu.Lock()
	fl.cancel()
	fl.mu.Unlock()
	fl.wg.Wait()
}

// FlattenPaused starts the background flatten of the memory image of
// sandbox id's pause snapshot snapDir. An image without a base file must
// be flattened before any resume maps it: that is done at once, and a
// resume that comes first waits for it (Restore). One with a base is
// flattened by flattenOnBase.
func (im *Images) FlattenPaused(ctx context.Context, id, snapDir string) {
	m, ok := unflattened(snapDir)
	if !ok {
		return
	}
	if !onBase(m) {
		im.cfg.Background(func() {
			if _, _, err := im.Restore(context.WithoutCancel(ctx), snapDir, true); err != nil {
				im.log.Warn("flatten memory after pause (the resume retries)", "sandbox", id, "err", err)
			}
		})
		return
	}
	im.flattenOnBase(id, m)
}

// FlattenInterrupted starts the flatten of a paused sandbox's image on a
// base that a restart interrupted (at load: an image without a base is
// left to its resume, which waits for it either way).
func (im *Images) FlattenInterrupted(id, snapDir string) {
	if m, ok := unflattened(snapDir); ok && onBase(m) {
		im.flattenOnBase(id, m)
	}
}

// StopFlatten cancels the background flatten of sandbox id's image, if one
// runs, and waits for it (a resume or kill goes on without it).
func (im *Images) StopFlatten(id string) { im.flat.stop(id) }

// unflattened reads the layered memory image of snapDir that has no flat
// file yet (false: no layered image, or flattened already).
func unflattened(snapDir string) (snapshot.MemoryImage, bool) {
	m, err := snapshot.ReadMemoryManifest(snapDir)
	if err != nil {
		return m, false // no layered image: the VMM's snapshot holds the memory
	}
	if _, err := os.Stat(m.File); err == nil {
		return m, false
	}
	return m, true
}

// onBase reports whether m is a base file with layers above it (what a
// restore can map and write the layers into).
func onBase(m snapshot.MemoryImage) bool {
	_, err := os.Stat(m.Base)
	return m.Base != "" && err == nil && len(m.Layers) > 1
}

// flattenOnBase flattens m into its file in the background, when
// Options.FlattenPaused and restored VMs map files (no memory devices); a
// resume that comes first stops it.
func (im *Images) flattenOnBase(id string, m snapshot.MemoryImage) {
	if !im.cfg.FlattenPaused || im.cfg.Devices != nil {
		return // with memory devices a resume maps the stack's device
	}
	im.flat.start(id, func(ctx context.Context) {
		start := time.Now()
		err := memsnap.Materialize(ctx, m.Layers, m.File)
		switch {
		case errors.Is(err, context.Canceled):
			im.log.Info("paused memory flatten stopped: the sandbox resumed or went first", "sandbox", id)
		case err != nil:
			im.log.Warn("flatten paused memory (a resume writes its layers instead)", "sandbox", id, "err", err)
		default:
			im.log.Info("paused memory flattened", "sandbox", id, "file", m.File, "layers", len(m.Layers),
				"took", time.Since(start).Round(time.Millisecond))
			if err := fpFlattenWritten.Inject(); err != nil {
				im.log.Warn("after paused memory flatten", "sandbox", id, "err", err)
			}
		}
	})
}
