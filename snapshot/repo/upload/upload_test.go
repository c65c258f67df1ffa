package upload

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/snapshot/repo/posix"
	"github.com/agentenv/agentenv/snapshot/repo/repotest"
	"github.com/agentenv/agentenv/snapshot/repo/s3"
	"github.com/agentenv/agentenv/snapshot/repo/s3/s3test"
)

// localSnapshot writes the files of a snapshot and returns its job.
func localSnapshot(t *testing.T, name string, seed uint64) Job {
	dir := t.TempDir()
	write := func(file string, n int, s uint64) string {
		p := filepath.Join(dir, file)
		if err := os.WriteFile(p, repotest.Random(s, n), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return Job{Name: name, Kind: repo.KindSnapshot, Parent: "base", Created: time.Now().UTC().Truncate(time.Second),
		Rootfs: []string{write("rootfs-1.lsmt", 300000, seed), write("rootfs-2.lsmt", 70000, seed+1)},
		Memory: []string{write("memory-1.lsmt", 200000, seed+2)},
		State:  write("state", 5000, seed+3), Config: write("config.json", 300, seed+4),
		WorkingSet: write("memory.workingset", 100, seed+5)}
}

// checkCommitted reads the manifest back and every layer through a verified
// remote read, comparing with the local files.
func checkCommitted(t *testing.T, r repo.Repository, j Job) {
	t.Helper()
	ctx := context.Background()
	m, err := r.Manifest(ctx, j.Name)
	if err != nil {
		t.Fatalf("manifest %s: %v", j.Name, err)
	}
	if m.Parent != j.Parent || len(m.Rootfs) != len(j.Rootfs) || len(m.Memory) != len(j.Memory) {
		t.Fatalf("manifest %s does not describe the job: %+v", j.Name, m)
	}
	for i, l := range append(m.Rootfs, m.Memory...) {
		want, _ := os.ReadFile(append(j.Rootfs, j.Memory...)[i])
		c, err := repo.OpenLayer(ctx, r, l, repo.LayerOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(want))
		if _, err := c.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("layer %d of %s read back: %v", i, j.Name, err)
		}
	}
	state, _ := os.ReadFile(j.State)
	if got, err := repo.ReadSmallBlob(ctx, r, m.State, 1<<20); err != nil || !bytes.Equal(got, state) {
		t.Fatalf("state of %s: %v", j.Name, err)
	}
}

func waitFor(t *testing.T, u *Uploader, name string, cond func(Status) bool) Status {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if st, ok := u.Status(name); ok && cond(st) {
			return st
		}
	}
	st, _ := u.Status(name)
	t.Fatalf("job %s never reached the expected state: %+v", name, st)
	return st
}

var fast = Options{MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}

// TestStoreDownThenUp: with the object store down, the job stays pending
// with the error and retries; once the store is back it is uploaded.
func TestStoreDownThenUp(t *testing.T) {
	srv := s3test.Start(t)
	cfg := srv.Bucket(t)
	ctx := context.Background()
	r, err := s3.Open(ctx, cfg, repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	opt := fast
	opt.Dir = t.TempDir()
	u, err := New(r, opt)
	if err != nil {
		t.Fatal(err)
	}
	u.Start(ctx)
	defer u.Close()
	j := localSnapshot(t, "snap-a", 1)
	if err := u.Enqueue(ctx, j); err != nil {
		t.Fatal(err)
	}
	st := waitFor(t, u, j.Name, func(s Status) bool { return s.Attempts >= 2 && s.State == Pending })
	if st.Error == "" || !strings.Contains(st.Error, "127.0.0.1") {
		t.Fatalf("a pending job after failed attempts says %q", st.Error)
	}
	srv.Restart(t)
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	st, err = u.Wait(wctx, j.Name)
	if err != nil || st.State != Uploaded || st.Error != "" {
		t.Fatalf("after the store came back: %+v, %v", st, err)
	}
	checkCommitted(t, r, j)
}

// TestRestartResumesQueue: a job enqueued by a process that stopped before
// uploading it is uploaded by the next process on the same queue.
func TestRestartResumesQueue(t *testing.T) {
	srv := s3test.Start(t)
	cfg := srv.Bucket(t)
	ctx := context.Background()
	r, err := s3.Open(ctx, cfg, repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	opt := fast
	opt.Dir = t.TempDir()
	u1, err := New(r, opt)
	if err != nil {
		t.Fatal(err)
	}
	u1.Start(ctx)
	j := localSnapshot(t, "snap-b", 10)
	if err := u1.Enqueue(ctx, j); err != nil {
		t.Fatal(err)
	}
	waitFor(t, u1, j.Name, func(s Status) bool { return s.Attempts >= 1 && s.State == Pending })
	u1.Close()

	srv.Restart(t)
	u2, err := New(r, opt)
	if err != nil {
		t.Fatal(err)
	}
	if st, ok := u2.Status(j.Name); !ok || st.State != Pending {
		t.Fatalf("the restarted queue lost the job: %+v %v", st, ok)
	}
	u2.Start(ctx)
	defer u2.Close()
	st, err := u2.Wait(ctx, j.Name)
	if err != nil || st.State != Uploaded {
		t.Fatalf("after the restart: %+v, %v", st, err)
	}
	checkCommitted(t, r, j)
}

// concurrencyRepo is a real repository that records how many commits run
// at once.
type concurrencyRepo struct {
	repo.Repository
	mu        sync.Mutex
	now, peak int
}

func (c *concurrencyRepo) Commit(ctx context.Context, m *repo.Manifest) error {
	c.mu.Lock()
	c.now++
	c.peak = max(c.peak, c.now)
	c.mu.Unlock()
	time.Sleep(20 * time.Millisecond) // hold the slot so overlaps show
	defer func() { c.mu.Lock(); c.now--; c.mu.Unlock() }()
	return c.Repository.Commit(ctx, m)
}

// TestBoundedConcurrencyAndFailures: at most Concurrency jobs run at once;
// a job whose local file is gone fails for good with the reason; an
// injected error before the commit is retried.
func TestBoundedConcurrencyAndFailures(t *testing.T) {
	base, err := posix.Open(t.TempDir(), repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := &concurrencyRepo{Repository: base}
	opt := fast
	opt.Dir, opt.Concurrency = t.TempDir(), 2
	u, err := New(r, opt)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := failpoint.Arm("upload/blobs-uploaded", "error@1"); err != nil {
		t.Fatal(err)
	}
	defer failpoint.Arm("upload/blobs-uploaded", "")
	var jobs []Job
	for i := range 6 {
		j := localSnapshot(t, "snap-"+string(rune('a'+i)), uint64(100+10*i))
		jobs = append(jobs, j)
		if err := u.Enqueue(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	gone := localSnapshot(t, "snap-gone", 200)
	os.Remove(gone.Memory[0])
	if err := u.Enqueue(ctx, gone); err != nil {
		t.Fatal(err)
	}
	u.Start(ctx)
	defer u.Close()
	for _, j := range jobs {
		if st, err := u.Wait(ctx, j.Name); err != nil || st.State != Uploaded {
			t.Fatalf("job %s: %+v, %v", j.Name, st, err)
		}
		checkCommitted(t, base, j)
	}
	st, err := u.Wait(ctx, gone.Name)
	if err != nil || st.State != Failed || !strings.Contains(st.Error, "memory-1.lsmt") {
		t.Fatalf("a job whose file is gone: %+v, %v", st, err)
	}
	retried := 0
	for _, s := range u.List() {
		if s.Attempts > 1 {
			retried++
		}
	}
	if retried != 1 {
		t.Fatalf("%d jobs took more than one attempt, want the one the fault point hit", retried)
	}
	r.mu.Lock()
	peak := r.peak
	r.mu.Unlock()
	if peak > 2 || peak < 1 {
		t.Fatalf("%d commits ran at once, want at most 2", peak)
	}
	if err := u.Forget(gone.Name); err != nil {
		t.Fatal(err)
	}
	if _, ok := u.Status(gone.Name); ok {
		t.Fatal("a forgotten job is still listed")
	}
}

// blockingRepo holds every blob upload until its context ends, and says
// when one started.
type blockingRepo struct {
	repo.Repository
	started chan string
}

func (b *blockingRepo) PutBlob(ctx context.Context, d repo.Digest, size int64, r io.Reader) error {
	select {
	case b.started <- string(d):
	default:
	}
	<-ctx.Done()
	return ctx.Err()
}

// TestCancel: a cancelled job never commits a manifest, whether it was in
// flight (its attempt is stopped) or pending behind it, and it is gone from
// the queue file too: the queue reopened holds neither and uploads the next
// job.
func TestCancel(t *testing.T) {
	ctx := context.Background()
	r, err := posix.Open(t.TempDir(), repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	br := &blockingRepo{Repository: r, started: make(chan string, 1)}
	opt := fast
	opt.Dir, opt.Concurrency = t.TempDir(), 1
	u, err := New(br, opt)
	if err != nil {
		t.Fatal(err)
	}
	u.Start(ctx)
	defer u.Close()
	inFlight, queued := localSnapshot(t, "snap-in-flight", 1), localSnapshot(t, "snap-queued", 10)
	for _, j := range []Job{inFlight, queued} {
		if err := u.Enqueue(ctx, j); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-br.started:
	case <-time.After(30 * time.Second):
		t.Fatal("no upload started")
	}
	waitFor(t, u, inFlight.Name, func(s Status) bool { return s.State == Uploading })
	for _, j := range []Job{inFlight, queued} {
		if err := u.Cancel(j.Name); err != nil {
			t.Fatal(err)
		}
		if st, ok := u.Status(j.Name); ok {
			t.Fatalf("%s after Cancel: %+v", j.Name, st)
		}
	}
	next := localSnapshot(t, "snap-next", 20)
	if err := u.Close(); err != nil {
		t.Fatal(err)
	}
	// The same queue, reopened on the store itself (nothing blocks it),
	// holds no cancelled job and uploads the next one.
	reopened, err := New(r, Options{Dir: opt.Dir})
	if err != nil {
		t.Fatal(err)
	}
	if got := reopened.List(); len(got) != 0 {
		t.Fatalf("the queue file still holds cancelled jobs: %+v", got)
	}
	reopened.Start(ctx)
	defer reopened.Close()
	if err := reopened.Enqueue(ctx, next); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if st, err := reopened.Wait(wctx, next.Name); err != nil || st.State != Uploaded {
		t.Fatalf("the job after the cancelled ones: %+v %v", st, err)
	}
	names, err := r.Manifests(ctx)
	if err != nil || len(names) != 1 || names[0] != next.Name {
		t.Fatalf("manifests %v (%v), want only %s", names, err, next.Name)
	}
}

// FuzzLoadQueue: whatever the queue file holds, loading it never panics,
// and a queue that loads holds only valid jobs in known states, which save
// and load again unchanged.
func FuzzLoadQueue(f *testing.F) {
	f.Add([]byte(`[{"job":{"name":"snap-a","kind":"snapshot","rootfs":["/x"],"state":"/s","config":"/c"},"status":{"name":"snap-a","state":"uploading"}}]`))
	f.Add([]byte(`[{"job":{"name":"snap-a","rootfs":["/x"],"state":"/s","config":"/c"},"status":{"name":"snap-a","state":"bogus"}}]`))
	f.Add([]byte(`[{"job":{"name":"a"},"status":{"name":"a"}},{"job":{"name":"a"},"status":{"name":"a"}}]`))
	f.Add([]byte(`{`))
	f.Fuzz(func(t *testing.T, data []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, queueFile), data, 0o600); err != nil {
			t.Fatal(err)
		}
		q, err := loadQueue(dir)
		if err != nil {
			return
		}
		for name, rec := range q.recs {
			if validJob(rec.Job) != nil || rec.Job.Name != name || !knownState(rec.Status.State) || rec.Status.State == Uploading {
				t.Fatalf("loaded a bad record %q: %+v", name, rec)
			}
		}
		if err := q.save(); err != nil {
			t.Fatal(err)
		}
		again, err := loadQueue(dir)
		if err != nil || len(again.recs) != len(q.recs) {
			t.Fatalf("a saved queue loads as %d records (%v), want %d", len(again.recs), err, len(q.recs))
		}
	})
}

// TestWorkingSetPack: a job with a working set commits the pack its
// uploader writes (Options.PackWorkingSet, given the job's memory layers
// and working set) as the manifest's WorkingSet; a pack that cannot be
// written leaves the manifest without one, committed all the same.
func TestWorkingSetPack(t *testing.T) {
	ctx := context.Background()
	for _, fail := range []bool{false, true} {
		r, err := posix.Open(t.TempDir(), repo.Options{})
		if err != nil {
			t.Fatal(err)
		}
		j := localSnapshot(t, "snap-pack", 7)
		ws, _ := os.ReadFile(j.WorkingSet)
		want := append([]byte(strings.Join(j.Memory, ",")+":"), ws...)
		opt := fast
		opt.Dir = t.TempDir()
		opt.PackWorkingSet = func(_ context.Context, w io.Writer, memory []string, workingSet []byte) (int64, error) {
			if fail {
				return 0, io.ErrUnexpectedEOF
			}
			n, err := w.Write(append([]byte(strings.Join(memory, ",")+":"), workingSet...))
			return int64(n), err
		}
		u, err := New(r, opt)
		if err != nil {
			t.Fatal(err)
		}
		u.Start(ctx)
		if err := u.Enqueue(ctx, j); err != nil {
			t.Fatal(err)
		}
		if st, err := u.Wait(ctx, j.Name); err != nil || st.State != Uploaded {
			t.Fatalf("pack failing %v: %+v, %v", fail, st, err)
		}
		u.Close()
		checkCommitted(t, r, j)
		m, err := r.Manifest(ctx, j.Name)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case fail && m.WorkingSet != nil:
			t.Fatalf("a pack that failed is in the manifest: %+v", m.WorkingSet)
		case fail:
		case m.WorkingSet == nil:
			t.Fatal("the manifest names no pack")
		default:
			got, err := repo.ReadSmallBlob(ctx, r, *m.WorkingSet, 1<<20)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("pack read back: %q, %v; want %q", got, err, want)
			}
		}
		if left, _ := filepath.Glob(filepath.Join(filepath.Dir(j.WorkingSet), ".pack-*")); len(left) != 0 {
			t.Fatalf("temporary packs left: %v", left)
		}
	}
}
