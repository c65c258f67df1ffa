package disk

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/storage/blob"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/image"
	"github.com/prometheus/client_golang/prometheus"
)

// Lazy rootfs restores. A sandbox, snapshot or template brought from the
// repository (package replica) does not wait for its rootfs
// layers: its image config names each by the URL of the node's layer
// socket (Remote.LazyURL), and the storage daemon's device reads them
// through it, verified chunk by chunk, while the VM runs. Only the small
// files are fetched before the VM starts, and the memory layers where VMs
// map memory files of their own (where they map the daemon's shared
// exports, memory is lazy too: lazymemory.go).
//
// Once the VM answered, a job per image config fetches its remote layers
// whole into the config's directory (Remote.Fetch: verified, peers first;
// the node then serves them to peers) and moves onto them:
//
//  1. every remote layer fetched as <config dir>/<hex> (orchestrator/lazy/fetched)
//  2. the config rewritten naming the files (atomicfile; orchestrator/lazy/configured)
//  3. every device reading one of those URLs moved onto the file under its
//     live export (storaged's localize: it checks the file's digest)
//
// Each state is valid: a config names complete things (the layers behind
// the URLs are whole in the repository; the files are written whole, then
// renamed). A restart finishes whatever a crash cut: a config that still
// names URLs gets its job again; a device that still reads a URL whose
// file is in its image config's directory is moved (localizeDevices). A
// device is made from a config under devMu's read lock and steps 2-3 hold
// it for writing, so no device made from the old config is missed. What
// needs the layers as files (a pause's seal and upload, a snapshot, a
// build's seal) first waits for the job (settle). A layer the store cannot
// give fails the guest's read of it (the daemon's and the node's logs name
// its digest) and the job retries with backoff.

var (
	fpLazyFetched    = failpoint.New("orchestrator/lazy/fetched")    // the remote layers are local files, the config still names their URLs
	fpLazyConfigured = failpoint.New("orchestrator/lazy/configured") // the config names the files, devices may still read the URLs
)

// errConfigGone ends a job whose config was removed (its owner was killed
// or deleted).
var errConfigGone = errors.New("the image config is gone")

// lazyRootfs runs the jobs that make remote rootfs layers local.
type lazyRootfs struct {
	m       *Manager
	remote  Fetcher
	onMoved func(cfg string)
	// devMu: read-held while a device is made from an image config,
	// write-held while a config flips to files and devices move.
	devMu sync.RWMutex

	mu    sync.Mutex
	jobs  map[string]*lazyJob // by image config path
	later map[string]bool     // configs of imports, started once their VM answered
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup

	pending prometheus.Gauge
	moved   prometheus.Counter
}

// lazyJob makes one config's remote layers local.
type lazyJob struct {
	cfg    string
	cancel context.CancelFunc
	done   chan struct{} // closed when the job ends
	final  error         // why it ended without moving (nil: moved, or nothing to move)

	mu    sync.Mutex
	tried chan struct{} // closed when an attempt fails, then replaced
	err   error         // the last failed attempt's
}

func newLazyRootfs(m *Manager, remote Fetcher, moved func(cfg string), reg prometheus.Registerer) *lazyRootfs {
	ctx, stop := context.WithCancel(context.Background())
	l := &lazyRootfs{m: m, remote: remote, onMoved: moved, jobs: map[string]*lazyJob{}, later: map[string]bool{}, ctx: ctx, stop: stop,
		pending: prometheus.NewGauge(prometheus.GaugeOpts{Name: "aenvd_rootfs_lazy_configs",
			Help: "Root disk image configs whose layers are still read from the repository (a lazy restore's background fetch)."}),
		moved: prometheus.NewCounter(prometheus.CounterOpts{Name: "aenvd_rootfs_lazy_moved_total",
			Help: "Root disk image configs moved from remote layers onto local files."}),
	}
	if reg != nil {
		reg.MustRegister(l.pending, l.moved)
	}
	return l
}

// remoteLowers lists the URL lowers of the image config at path.
func remoteLowers(path string) ([]string, error) {
	cfg, err := image.LoadConfig(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range cfg.Lowers {
		if l.URL != "" {
			out = append(out, l.URL)
		}
	}
	return out, nil
}

// IsRemote says whether the image config at path names a URL lower.
func IsRemote(path string) bool {
	urls, err := remoteLowers(path)
	return err == nil && len(urls) > 0
}

// creating holds devMu for reading while a device is made; call the result
// when it is.
func (l *lazyRootfs) creating() func() {
	l.devMu.RLock()
	return l.devMu.RUnlock
}

// deferStart notes a config an import wrote: its job starts once the VM that
// brought it answered (startLater), so the fetch does not compete with the
// restore.
func (l *lazyRootfs) deferStart(cfg string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.later[cfg] = true
}

// startLater starts the jobs deferStart noted.
func (l *lazyRootfs) startLater() {
	l.mu.Lock()
	cfgs := l.later
	l.later = map[string]bool{}
	l.mu.Unlock()
	for cfg := range cfgs {
		l.start(cfg)
	}
}

// start starts the job of cfg when it names remote layers and none runs;
// it returns the running job (nil: nothing to do).
func (l *lazyRootfs) start(cfg string) *lazyJob {
	if cfg == "" || l.remote == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if j, ok := l.jobs[cfg]; ok {
		return j
	}
	if l.ctx.Err() != nil || !IsRemote(cfg) {
		return nil
	}
	ctx, cancel := context.WithCancel(l.ctx)
	j := &lazyJob{cfg: cfg, cancel: cancel, done: make(chan struct{}), tried: make(chan struct{})}
	l.jobs[cfg] = j
	delete(l.later, cfg)
	l.pending.Inc()
	l.wg.Add(1)
	go l.run(ctx, j)
	return j
}

// settle waits until cfg names no remote layer and the devices reading them
// moved, starting the job if needed; an attempt that fails returns its
// error (the job retries on its own).
func (l *lazyRootfs) settle(ctx context.Context, cfg string) error {
	j := l.start(cfg)
	if j == nil {
		return nil
	}
	j.mu.Lock()
	tried := j.tried
	j.mu.Unlock()
	select {
	case <-j.done:
		return j.final
	case <-tried:
		j.mu.Lock()
		defer j.mu.Unlock()
		return fmt.Errorf("the rootfs layers of %s are not local yet: %w", cfg, j.err)
	case <-ctx.Done():
		return fmt.Errorf("wait for the rootfs layers of %s: %w", cfg, ctx.Err())
	}
}

// run retries the job's move with backoff until it succeeds, its config is
// gone or it is cancelled.
func (l *lazyRootfs) run(ctx context.Context, j *lazyJob) {
	defer l.wg.Done()
	defer func() {
		l.mu.Lock()
		delete(l.jobs, j.cfg)
		l.mu.Unlock()
		l.pending.Dec()
		close(j.done)
	}()
	for wait := time.Second; ; wait = min(2*wait, time.Minute) {
		err := l.moveOnce(ctx, j.cfg)
		switch {
		case err == nil:
			if l.onMoved != nil {
				l.onMoved(j.cfg)
			}
			return
		case errors.Is(err, errConfigGone):
			return
		case ctx.Err() != nil:
			j.final = ctx.Err()
			return
		}
		l.m.log.Warn("rootfs layers stay remote for now; retrying", "config", j.cfg, "retry_in", wait, "err", err)
		j.mu.Lock()
		j.err = err
		close(j.tried)
		j.tried = make(chan struct{})
		j.mu.Unlock()
		select {
		case <-ctx.Done():
			j.final = ctx.Err()
			return
		case <-time.After(wait):
		}
	}
}

// moveOnce runs steps 1-3 (see above) for cfg.
func (l *lazyRootfs) moveOnce(ctx context.Context, cfg string) error {
	c, err := image.LoadConfig(cfg)
	if errors.Is(err, fs.ErrNotExist) {
		return errConfigGone
	}
	if err != nil {
		return err
	}
	start, dir := time.Now(), filepath.Dir(cfg)
	var moved int
	var bytes int64
	for i, lw := range c.Lowers {
		if lw.URL == "" {
			continue
		}
		layer, ok := l.remote.LazyLayer(lw.URL)
		if !ok {
			return fmt.Errorf("lower %s of %s names no layer of the repository", lw.URL, cfg)
		}
		path, err := l.remote.Fetch(ctx, layer, dir)
		if err != nil {
			return fmt.Errorf("fetch layer %s: %w", layer.Digest, err)
		}
		c.Lowers[i] = image.LayerRef{File: path}
		moved, bytes = moved+1, bytes+layer.Size
	}
	if moved == 0 {
		return nil
	}
	if err := fpLazyFetched.Inject(); err != nil {
		return err
	}
	l.devMu.Lock()
	defer l.devMu.Unlock()
	if _, err := os.Stat(cfg); err != nil {
		return errConfigGone // removed while its layers were fetched
	}
	if err := c.Save(cfg); err != nil {
		return err
	}
	if err := fpLazyConfigured.Inject(); err != nil {
		return err
	}
	if err := l.localizeDevices(ctx); err != nil {
		return err
	}
	l.moved.Inc()
	l.m.log.Info("rootfs layers fetched; the disks read local files", "config", cfg, "layers", moved, "bytes", bytes,
		"took", time.Since(start).Round(time.Millisecond))
	return nil
}

// localizeDevices moves every device that reads a URL whose layer is a file
// in its image config's directory (<dir>/<hex>, where a job fetches it)
// onto that file.
func (l *lazyRootfs) localizeDevices(ctx context.Context) error {
	devs, err := l.m.sd.List(ctx)
	if err != nil {
		return fmt.Errorf("list storage devices: %w", err)
	}
	var errs []error
	for _, d := range devs {
		moves := localCopies(d)
		if len(moves) == 0 {
			continue
		}
		_, err := l.m.sd.Localize(ctx, rpc.LocalizeParams{ID: d.ID, Lowers: moves})
		if err != nil && !errors.Is(err, rpc.ErrNotFound) {
			errs = append(errs, fmt.Errorf("move device %d onto local layers: %w", d.ID, err))
		}
	}
	return errors.Join(errs...)
}

// localCopies pairs the URL lowers of d with the files a job fetched them
// into.
func localCopies(d rpc.Device) []rpc.LocalLower {
	if d.State != rpc.StateActive || d.Kind == rpc.KindShared {
		return nil
	}
	var out []rpc.LocalLower
	for _, u := range d.Layers {
		digest, ok := blob.URLDigest(u)
		if !blob.IsURL(u) || !ok {
			continue
		}
		f := filepath.Join(filepath.Dir(d.Image), strings.TrimPrefix(digest, "sha256:"))
		if st, err := os.Stat(f); err == nil && st.Mode().IsRegular() {
			out = append(out, rpc.LocalLower{URL: u, File: f})
		}
	}
	return out
}

// forget cancels the jobs of configs under dir and waits for them (dir is
// about to be removed).
func (l *lazyRootfs) forget(dir string) {
	prefix := filepath.Clean(dir) + string(filepath.Separator)
	l.mu.Lock()
	var jobs []*lazyJob
	for cfg, j := range l.jobs {
		if strings.HasPrefix(cfg, prefix) {
			jobs = append(jobs, j)
		}
	}
	for cfg := range l.later {
		if strings.HasPrefix(cfg, prefix) {
			delete(l.later, cfg)
		}
	}
	l.mu.Unlock()
	for _, j := range jobs {
		j.cancel()
		<-j.done
	}
}

// close cancels every job and waits for them.
func (l *lazyRootfs) close() {
	l.stop()
	l.wg.Wait()
}

// resumeAll starts the job of every config of cfgs that still names
// remote layers (a restart), and moves the devices a crash left on URLs
// whose files are here.
func (l *lazyRootfs) resumeAll(ctx context.Context, cfgs []string) {
	if l.remote == nil {
		return
	}
	for _, cfg := range cfgs {
		l.start(cfg)
	}
	l.devMu.Lock()
	defer l.devMu.Unlock()
	if err := l.localizeDevices(ctx); err != nil {
		l.m.log.Warn("move devices onto local layers (the next job retries)", "err", err)
	}
}

// Fetcher is the repository's read side as lazy layers need it.
type Fetcher interface {
	// LazyLayer is the layer a lazy URL names.
	LazyLayer(url string) (repo.Layer, bool)
	// Fetch writes layer l whole (verified) into dir and returns its path.
	Fetch(ctx context.Context, l repo.Layer, dir string) (string, error)
}

// Settle waits until the layers of every image config of cfgs are files
// here (what needs them as files: a seal, an upload, a snapshot).
func (m *Manager) Settle(ctx context.Context, cfgs ...string) error {
	for _, cfg := range cfgs {
		if err := m.lazy.settle(ctx, cfg); err != nil {
			return err
		}
	}
	return nil
}

// LocalizeLater notes an image config an import wrote: its layers are
// fetched once StartLocalize runs (after the VM that brought it answered,
// so the fetch does not compete with the restore).
func (m *Manager) LocalizeLater(cfg string) { m.lazy.deferStart(cfg) }

// StartLocalize starts the fetches LocalizeLater noted.
func (m *Manager) StartLocalize() { m.lazy.startLater() }

// Forget cancels the fetches of configs under dir and waits for them (dir
// is about to be removed).
func (m *Manager) Forget(dir string) { m.lazy.forget(dir) }

// Localize starts the fetch of every config of cfgs that still names
// remote layers (a restart) and moves the devices a crash left on URLs
// whose files are here.
func (m *Manager) Localize(ctx context.Context, cfgs []string) { m.lazy.resumeAll(ctx, cfgs) }

// IsRemote says whether the image config at cfg names a layer still read
// from the repository.
func (m *Manager) IsRemote(cfg string) bool { return IsRemote(cfg) }
