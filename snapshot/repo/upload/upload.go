// Package upload owns the background commit of local snapshots to the
// snapshot repository: a durable queue of jobs (a job is one snapshot's local
// files and the manifest to commit for them), worked by a bounded number of
// goroutines, each upload retried with backoff while the store is down. The
// node's own commit stays local and synchronous; this only makes the
// snapshot reachable from other nodes, later if it must. The queue is a
// file written with internal/atomicfile, so a restart resumes it.
package upload

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/snapshot/repo"
)

// Fault points between the durable steps of one upload.
var (
	fpClaimed  = failpoint.New("upload/claimed")
	fpUploaded = failpoint.New("upload/blobs-uploaded")
	fpCommit   = failpoint.New("upload/committed")
)

// Job is one local snapshot or template to commit to the repository.
type Job struct {
	Name    string    `json:"name"` // the manifest's name
	Kind    string    `json:"kind"` // repo.KindSnapshot or repo.KindTemplate
	Parent  string    `json:"parent,omitempty"`
	Created time.Time `json:"created"`
	Rootfs  []string  `json:"rootfs"` // sealed layer files, bottom to top
	Memory  []string  `json:"memory"`
	State   string    `json:"state"`  // the VMM's state file
	Config  string    `json:"config"` // the VM's configuration file
	// WorkingSet, when set, is the memory stack's working set file: its
	// pack (Options.PackWorkingSet) is committed with the manifest (a
	// failure is logged: a restore elsewhere only goes slower without).
	WorkingSet string `json:"working_set,omitempty"`
	// Fence is the Fence's stamp at Enqueue (fence.go).
	Fence string `json:"fence,omitempty"`
}

// State is where a job is.
type State string

// The states of a job: pending (waiting for its first or next attempt),
// uploading, uploaded (its manifest is committed) and failed (an error no
// retry can fix: a local file gone or changed, a manifest of that name that
// differs).
const (
	Pending   State = "pending"
	Uploading State = "uploading"
	Uploaded  State = "uploaded"
	Failed    State = "failed"
)

// Status is a job's state as the node reports it.
type Status struct {
	Name        string    `json:"name"`
	State       State     `json:"state"`
	Attempts    int       `json:"attempts"`
	Error       string    `json:"error,omitempty"` // the last attempt's
	NextAttempt time.Time `json:"next_attempt,omitzero"`
	Updated     time.Time `json:"updated"`
}

// Options tune an Uploader.
type Options struct {
	// Dir holds the queue file (created when missing).
	Dir string
	// Concurrency is the number of jobs uploaded at once; default 2.
	Concurrency int
	// MinBackoff and MaxBackoff bound the wait before a retry, doubling
	// from the first to the second; defaults 1 s and 5 min.
	MinBackoff, MaxBackoff time.Duration
	// ChunkSize is the chunk size of the layers' tables; 0: the default.
	ChunkSize int64
	// PackWorkingSet, when set, writes to w the pack of a job's working
	// set (the bytes of its pages, read from the memory layers; package
	// memsnap's WritePack), committed with the manifest
	// (repo.Manifest.WorkingSet).
	PackWorkingSet func(ctx context.Context, w io.Writer, memory []string, workingSet []byte) (int64, error)
}

type record struct {
	Job    Job    `json:"job"`
	Status Status `json:"status"`
}

// Uploader works the queue.
type Uploader struct {
	r   repo.Repository
	opt Options
	q   *queue

	mu      sync.Mutex
	changed chan struct{}                 // closed and replaced on every change
	running map[string]context.CancelFunc // the attempts in flight, by job
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	started bool
	fence   Fence
}

// New loads the queue in opt.Dir; jobs a previous process was uploading are
// pending again. Start begins the work.
func New(r repo.Repository, opt Options) (*Uploader, error) {
	if opt.Concurrency <= 0 {
		opt.Concurrency = 2
	}
	if opt.MinBackoff <= 0 {
		opt.MinBackoff = time.Second
	}
	if opt.MaxBackoff < opt.MinBackoff {
		opt.MaxBackoff = max(5*time.Minute, opt.MinBackoff)
	}
	q, err := loadQueue(opt.Dir)
	if err != nil {
		return nil, err
	}
	return &Uploader{r: r, opt: opt, q: q, changed: make(chan struct{}), running: map[string]context.CancelFunc{}}, nil
}

// Start starts the workers; they stop at Close (or when ctx is done).
func (u *Uploader) Start(ctx context.Context) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.started {
		return
	}
	u.started = true
	ctx, u.cancel = context.WithCancel(ctx)
	for range u.opt.Concurrency {
		u.wg.Add(1)
		go func() {
			defer u.wg.Done()
			u.work(ctx)
		}()
	}
}

// Close stops the workers and waits for them; an upload in flight is
// abandoned and stays pending in the queue for the next process.
func (u *Uploader) Close() error {
	u.mu.Lock()
	cancel := u.cancel
	u.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	u.wg.Wait()
	return nil
}

// Enqueue adds a job, durably: once it returns, the job survives a crash.
// A job of a name already queued and not failed is left as it is.
func (u *Uploader) Enqueue(ctx context.Context, j Job) error {
	if err := validJob(j); err != nil {
		return fmt.Errorf("enqueue upload %s: %w", j.Name, err)
	}
	if j.Created.IsZero() {
		j.Created = time.Now().UTC()
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if rec, ok := u.q.get(j.Name); ok && rec.Status.State != Failed {
		return nil
	}
	u.stamp(&j)
	now := time.Now()
	err := u.q.put(record{Job: j, Status: Status{Name: j.Name, State: Pending, Updated: now, NextAttempt: now}})
	if err != nil {
		return fmt.Errorf("enqueue upload %s: %w", j.Name, err)
	}
	u.notifyLocked()
	return nil
}

func validJob(j Job) error {
	if err := repo.ValidName(j.Name); err != nil {
		return err
	}
	if len(j.Rootfs) == 0 || j.State == "" || j.Config == "" {
		return fmt.Errorf("a job needs rootfs layers, a state and a config file: %w", repo.ErrInvalid)
	}
	return nil
}

// Status returns a job's status.
func (u *Uploader) Status(name string) (Status, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	rec, ok := u.q.get(name)
	return rec.Status, ok
}

// List returns every job's status, by name.
func (u *Uploader) List() []Status {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []Status
	for _, rec := range u.q.recs {
		out = append(out, rec.Status)
	}
	slices.SortFunc(out, func(a, b Status) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Forget drops a job that is uploaded or failed (its record only).
func (u *Uploader) Forget(name string) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	rec, ok := u.q.get(name)
	if !ok {
		return nil
	}
	if rec.Status.State != Uploaded && rec.Status.State != Failed {
		return fmt.Errorf("forget upload %s: it is %s", name, rec.Status.State)
	}
	return u.q.remove(name)
}

// Cancel drops a job whatever its state: a pending one never runs, one in
// flight is stopped (its attempt ends without a manifest, unless the
// manifest was already written) and not retried. It is for a job whose
// files are about to go: a killed sandbox's pauses, or a stale copy's that
// another node has taken over.
func (u *Uploader) Cancel(name string) error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if _, ok := u.q.get(name); !ok {
		return nil
	}
	if err := u.q.remove(name); err != nil {
		return fmt.Errorf("cancel upload %s: %w", name, err)
	}
	if stop, ok := u.running[name]; ok {
		stop()
	}
	u.notifyLocked()
	return nil
}

// Wait blocks until the job is uploaded or failed, and returns its status.
func (u *Uploader) Wait(ctx context.Context, name string) (Status, error) {
	for {
		u.mu.Lock()
		rec, ok := u.q.get(name)
		ch := u.changed
		u.mu.Unlock()
		if !ok {
			return Status{}, fmt.Errorf("wait for upload %s: no such job", name)
		}
		if rec.Status.State == Uploaded || rec.Status.State == Failed {
			return rec.Status, nil
		}
		select {
		case <-ctx.Done():
			return rec.Status, fmt.Errorf("wait for upload %s: %w", name, ctx.Err())
		case <-ch:
		}
	}
}

func (u *Uploader) notifyLocked() {
	close(u.changed)
	u.changed = make(chan struct{})
}

// work runs jobs until ctx is done.
func (u *Uploader) work(ctx context.Context) {
	for {
		rec, wait, ch := u.claim()
		if rec == nil {
			timer := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case <-ch:
			case <-timer.C:
			}
			timer.Stop()
			continue
		}
		err := u.attempt(ctx, rec.Job)
		u.finish(ctx, rec.Job.Name, err)
		if ctx.Err() != nil {
			return
		}
	}
}

// attempt runs one attempt of j, which Cancel can stop.
func (u *Uploader) attempt(ctx context.Context, j Job) error {
	jctx, stop := context.WithCancel(ctx)
	defer stop()
	u.mu.Lock()
	u.running[j.Name] = stop
	u.mu.Unlock()
	defer func() {
		u.mu.Lock()
		delete(u.running, j.Name)
		u.mu.Unlock()
	}()
	return u.run(jctx, j)
}

// claim marks the pending job due first as uploading and returns it; with
// none due, it returns how long to wait and the channel that says the queue
// changed.
func (u *Uploader) claim() (*record, time.Duration, chan struct{}) {
	u.mu.Lock()
	defer u.mu.Unlock()
	now := time.Now()
	wait := time.Hour
	var due *record
	for _, rec := range u.q.recs {
		if rec.Status.State != Pending {
			continue
		}
		if d := rec.Status.NextAttempt.Sub(now); d > 0 {
			wait = min(wait, d)
			continue
		}
		if due == nil || rec.Status.NextAttempt.Before(due.Status.NextAttempt) {
			due = rec
		}
	}
	if due == nil {
		return nil, wait, u.changed
	}
	st := due.Status
	st.State, st.Attempts, st.Updated = Uploading, st.Attempts+1, now
	if err := u.q.setStatus(st); err != nil {
		slog.Error("upload queue: recording a claim failed; retrying later", "job", st.Name, "err", err)
		return nil, u.opt.MinBackoff, u.changed
	}
	u.notifyLocked()
	c := *due
	return &c, 0, u.changed
}

// finish records an attempt's outcome.
func (u *Uploader) finish(ctx context.Context, name string, err error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	rec, ok := u.q.get(name)
	if !ok {
		return
	}
	st := rec.Status
	st.Updated = time.Now()
	switch {
	case err == nil:
		st.State, st.Error, st.NextAttempt = Uploaded, "", time.Time{}
		slog.Info("uploaded to the snapshot repository", "snapshot", name, "attempts", st.Attempts)
	case ctx.Err() != nil:
		st.State, st.Attempts = Pending, max(st.Attempts-1, 0) // stopped, not failed
		st.NextAttempt = st.Updated
	case permanent(err):
		st.State, st.Error = Failed, err.Error()
		slog.Error("upload to the snapshot repository failed for good", "snapshot", name, "err", err)
	default:
		st.State, st.Error = Pending, err.Error()
		st.NextAttempt = st.Updated.Add(u.backoff(st.Attempts))
		slog.Warn("upload to the snapshot repository failed; retrying", "snapshot", name, "attempt", st.Attempts,
			"retry_in", st.NextAttempt.Sub(st.Updated).Round(time.Millisecond), "err", err)
	}
	if err := u.q.setStatus(st); err != nil {
		slog.Error("upload queue: recording an outcome failed", "job", name, "err", err)
	}
	u.notifyLocked()
}

func (u *Uploader) backoff(attempts int) time.Duration {
	d := u.opt.MinBackoff
	for i := 1; i < attempts && d < u.opt.MaxBackoff; i++ {
		d *= 2
	}
	return min(d, u.opt.MaxBackoff)
}

// permanent tells errors no retry fixes from a store that is down or slow.
func permanent(err error) bool {
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, repo.ErrDigestMismatch) || errors.Is(err, ErrFenced) ||
		errors.Is(err, repo.ErrInvalid) || errors.Is(err, repo.ErrExists)
}

// run uploads a job's blobs (those present are skipped) and commits its
// manifest.
func (u *Uploader) run(ctx context.Context, j Job) error {
	if err := fpClaimed.Inject(); err != nil {
		return err
	}
	m := &repo.Manifest{Schema: repo.SchemaVersion, Name: j.Name, Kind: j.Kind, Parent: j.Parent, Created: j.Created}
	if m.Kind == "" {
		m.Kind = repo.KindSnapshot
	}
	for _, layers := range []struct {
		paths []string
		dst   *[]repo.Layer
	}{{j.Rootfs, &m.Rootfs}, {j.Memory, &m.Memory}} {
		for _, p := range layers.paths {
			l, err := repo.PutLayerFile(ctx, u.r, p, u.opt.ChunkSize)
			if err != nil {
				return err
			}
			*layers.dst = append(*layers.dst, l)
		}
	}
	var err error
	if m.State, err = repo.PutFile(ctx, u.r, j.State); err != nil {
		return err
	}
	if m.Config, err = repo.PutFile(ctx, u.r, j.Config); err != nil {
		return err
	}
	m.WorkingSet = u.putPack(ctx, j)
	if err := fpUploaded.Inject(); err != nil {
		return err
	}
	if err := u.checkFence(ctx, j); err != nil {
		return err
	}
	if err := u.r.Commit(ctx, m); err != nil {
		return err
	}
	return fpCommit.Inject()
}

// putPack puts the pack of the job's working set, when it has one and the
// uploader packs them, and returns its blob (nil without one: a failure
// is logged, since a restore elsewhere only goes slower without it).
func (u *Uploader) putPack(ctx context.Context, j Job) *repo.Blob {
	if j.WorkingSet == "" || len(j.Memory) == 0 || u.opt.PackWorkingSet == nil {
		return nil
	}
	b, err := u.writePack(ctx, j)
	if err != nil {
		slog.Warn("upload: memory working set not packed (a restore elsewhere reads its pages from the layers)", "snapshot", j.Name, "err", err)
		return nil
	}
	return b
}

// writePack writes the job's pack to a temporary file next to its working
// set, puts it and removes the file.
func (u *Uploader) writePack(ctx context.Context, j Job) (*repo.Blob, error) {
	ws, err := readBounded(j.WorkingSet, maxWorkingSet)
	if err != nil {
		return nil, err
	}
	f, err := os.CreateTemp(filepath.Dir(j.WorkingSet), ".pack-*")
	if err != nil {
		return nil, fmt.Errorf("pack working set: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	if _, err := u.opt.PackWorkingSet(ctx, bw, j.Memory, ws); err != nil {
		return nil, fmt.Errorf("pack working set: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return nil, fmt.Errorf("pack working set: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("pack working set: %w", err)
	}
	if st.Size() > repo.MaxWorkingSetPack {
		return nil, fmt.Errorf("pack working set: %d bytes, at most %d", st.Size(), int64(repo.MaxWorkingSetPack))
	}
	b, err := repo.PutFile(ctx, u.r, f.Name())
	if err != nil {
		return nil, err
	}
	return &b, nil
}

// maxWorkingSet bounds a job's working set file (memsnap's bound).
const maxWorkingSet = 16 << 20

// readBounded reads the file at path, refusing one over limit bytes.
func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s is over %d bytes", path, limit)
	}
	return data, nil
}
