package repotest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/snapshot/repo"
)

// The checks of manifests, commits and garbage collection.

func testCommit(t *testing.T, b repo.Backend) {
	ctx := ctxT(t)
	r := repo.New(b, repo.Options{})
	m := NewManifest(t, r, "snap-1", 1)
	m.Parent = "base"
	if err := r.Commit(ctx, m); err != nil {
		t.Fatal(err)
	}
	got, err := r.Manifest(ctx, "snap-1")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := m.Encode()
	gotData, _ := got.Encode()
	if !bytes.Equal(gotData, want) {
		t.Fatalf("manifest read back differs:\n got %s\nwant %s", gotData, want)
	}
	m2 := NewManifest(t, r, "snap-0", 2)
	if err := r.Commit(ctx, m2); err != nil {
		t.Fatal(err)
	}
	names, err := r.Manifests(ctx)
	if err != nil || !slices.Equal(names, []string{"snap-0", "snap-1"}) {
		t.Fatalf("manifests = %v, %v", names, err)
	}
	if err := r.DeleteManifest(ctx, "snap-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Manifest(ctx, "snap-1"); !errors.Is(err, repo.ErrNotFound) {
		t.Fatalf("read of a deleted manifest: %v", err)
	}
	if leases, _ := b.List(ctx, "leases/"); len(leases) != 0 {
		t.Fatalf("commits left leases: %v", leases)
	}
}

func testCommitMissing(t *testing.T, b repo.Backend) {
	ctx := ctxT(t)
	r := repo.New(b, repo.Options{})
	m := NewManifest(t, r, "snap", 3)
	missing := repo.DigestOf([]byte("never uploaded"))
	m.Memory = append(m.Memory, repo.Layer{Blob: repo.Blob{Digest: missing, Size: 14}, Chunks: m.State})
	err := r.Commit(ctx, m)
	if !errors.Is(err, repo.ErrMissingBlob) || !strings.Contains(err.Error(), string(missing)) {
		t.Fatalf("commit naming a missing blob: %v", err)
	}
	m = NewManifest(t, r, "snap", 3)
	m.Config.Size++
	if err := r.Commit(ctx, m); !errors.Is(err, repo.ErrMissingBlob) {
		t.Fatalf("commit naming a blob with a wrong size: %v", err)
	}
	if _, err := r.Manifest(ctx, "snap"); !errors.Is(err, repo.ErrNotFound) {
		t.Fatalf("a refused manifest is visible: %v", err)
	}
	m.Name = "../x"
	if err := r.Commit(ctx, m); !errors.Is(err, repo.ErrInvalid) {
		t.Fatalf("commit of a bad name: %v", err)
	}
}

func testCommitConflict(t *testing.T, b repo.Backend) {
	ctx := ctxT(t)
	r := repo.New(b, repo.Options{})
	m := NewManifest(t, r, "snap", 4)
	if err := r.Commit(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := r.Commit(ctx, m); err != nil {
		t.Fatalf("a retried identical commit: %v", err)
	}
	other := NewManifest(t, r, "snap", 5)
	if err := r.Commit(ctx, other); !errors.Is(err, repo.ErrExists) {
		t.Fatalf("a different manifest under a committed name: %v", err)
	}
}

func testManifestUntrusted(t *testing.T, b repo.Backend) {
	ctx := ctxT(t)
	r := repo.New(b, repo.Options{})
	m := NewManifest(t, r, "good", 6)
	good, _ := m.Encode()
	cases := map[string][]byte{
		"garbage":    []byte("\x00not json"),
		"truncated":  good[:len(good)/2],
		"renamed":    good, // stored under another name than it says
		"bad-digest": bytes.Replace(good, []byte(m.State.Digest), []byte("sha256:"+strings.Repeat("Z", 64)), 1),
		"trailing":   append(slices.Clone(good), []byte(` {}`)...),
		"huge":       bytes.Repeat([]byte(" "), repo.MaxManifestSize+1),
	}
	for name, data := range cases {
		if err := b.Put(ctx, "manifests/"+name, bytes.NewReader(data), int64(len(data)), nil); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Manifest(ctx, name); !errors.Is(err, repo.ErrInvalid) {
			t.Errorf("manifest %s from the store: %v, want ErrInvalid", name, err)
		}
	}
}

func testGC(t *testing.T, b repo.Backend) {
	ctx := ctxT(t)
	r := repo.New(b, repo.Options{})
	keep := NewManifest(t, r, "keep", 7)
	drop := NewManifest(t, r, "drop", 8)
	for _, m := range []*repo.Manifest{keep, drop} {
		if err := r.Commit(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	orphan := PutRandom(t, r, 99, 777)
	if err := r.DeleteManifest(ctx, "drop"); err != nil {
		t.Fatal(err)
	}
	st, err := r.GC(ctx, repo.GCOptions{Grace: time.Hour})
	if err != nil || len(st.Deleted) != 0 || st.Young != len(drop.Blobs())+1 {
		t.Fatalf("gc within the grace period: %+v, %v", st, err)
	}
	st, err = r.GC(ctx, repo.GCOptions{DryRun: true})
	if err != nil || len(st.Deleted) != len(drop.Blobs())+1 {
		t.Fatalf("dry run: %+v, %v", st, err)
	}
	if _, err := r.StatBlob(ctx, orphan.Digest); err != nil {
		t.Fatalf("a dry run deleted: %v", err)
	}
	st, err = r.GC(ctx, repo.GCOptions{})
	if err != nil || st.Manifests != 1 || st.Referenced != len(keep.Blobs()) {
		t.Fatalf("gc: %+v, %v", st, err)
	}
	want := []repo.Digest{orphan.Digest}
	for _, bl := range drop.Blobs() {
		want = append(want, bl.Digest)
	}
	slices.Sort(want)
	slices.Sort(st.Deleted)
	if !slices.Equal(st.Deleted, want) {
		t.Fatalf("gc deleted %v, want %v", st.Deleted, want)
	}
	for _, bl := range keep.Blobs() {
		if _, err := r.StatBlob(ctx, bl.Digest); err != nil {
			t.Fatalf("gc removed referenced blob %s: %v", bl.Digest, err)
		}
	}
	for _, d := range want {
		if _, err := r.StatBlob(ctx, d); !errors.Is(err, repo.ErrNotFound) {
			t.Fatalf("unreferenced blob %s survived: %v", d, err)
		}
	}
	if markers, _ := b.List(ctx, "gc/"); len(markers) != 0 {
		t.Fatalf("gc left its marker: %v", markers)
	}
}

func putLease(t *testing.T, b repo.Backend, key string, blobs ...repo.Digest) {
	t.Helper()
	var quoted []string
	for _, d := range blobs {
		quoted = append(quoted, fmt.Sprintf("%q", d))
	}
	data := []byte(fmt.Sprintf(`{"manifest":"x","blobs":[%s]}`, strings.Join(quoted, ",")))
	if err := b.Put(context.Background(), key, bytes.NewReader(data), int64(len(data)), nil); err != nil {
		t.Fatal(err)
	}
}

func testGCLeases(t *testing.T, b repo.Backend) {
	ctx := ctxT(t)
	r := repo.New(b, repo.Options{LeaseTTL: time.Hour})
	held := PutRandom(t, r, 10, 500)
	loose := PutRandom(t, r, 11, 500)
	putLease(t, b, "leases/live", held.Digest)
	st, err := r.GC(ctx, repo.GCOptions{})
	if err != nil || st.Protected != 1 || !slices.Equal(st.Deleted, []repo.Digest{loose.Digest}) {
		t.Fatalf("gc with a live lease: %+v, %v", st, err)
	}
	if _, err := r.StatBlob(ctx, held.Digest); err != nil {
		t.Fatalf("gc removed a blob a live lease holds: %v", err)
	}
	// A lease past its lifetime (a commit that died) protects nothing and goes.
	short := repo.New(b, repo.Options{LeaseTTL: time.Second})
	time.Sleep(1100 * time.Millisecond) // store clocks may count whole seconds
	st, err = short.GC(ctx, repo.GCOptions{})
	if err != nil || !slices.Equal(st.Deleted, []repo.Digest{held.Digest}) {
		t.Fatalf("gc with a stale lease: %+v, %v", st, err)
	}
	if leases, _ := b.List(ctx, "leases/"); len(leases) != 0 {
		t.Fatalf("the stale lease stayed: %v", leases)
	}
	// A fresh lease that cannot be read stops the collection.
	garbage := []byte("{not json")
	if err := b.Put(ctx, "leases/bad", bytes.NewReader(garbage), int64(len(garbage)), nil); err != nil {
		t.Fatal(err)
	}
	PutRandom(t, r, 12, 10)
	if _, err := r.GC(ctx, repo.GCOptions{}); !errors.Is(err, repo.ErrInvalid) {
		t.Fatalf("gc with an unreadable live lease: %v", err)
	}
}

// waitLease returns once a commit's lease is in the store.
func waitLease(t *testing.T, b repo.Backend) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if leases, err := b.List(context.Background(), "leases/"); err == nil && len(leases) > 0 {
			return
		}
	}
	t.Fatal("no commit lease appeared")
}

// gcWatch is a backend that reports each listing of the GC markers: a
// commit lists them once its lease is written, to see whether it must wait.
type gcWatch struct {
	repo.Backend
	polled chan struct{}
}

func (w *gcWatch) List(ctx context.Context, prefix string) ([]repo.ObjectInfo, error) {
	if prefix == "gc/" {
		select {
		case w.polled <- struct{}{}:
		default:
		}
	}
	return w.Backend.List(ctx, prefix)
}

// waitPoll returns once the commit listed the GC markers.
func (w *gcWatch) waitPoll(t *testing.T) {
	t.Helper()
	select {
	case <-w.polled:
	case <-time.After(30 * time.Second):
		t.Fatal("the commit never looked for a garbage collection")
	}
}

func testCommitWaitsForGC(t *testing.T, b repo.Backend) {
	ctx := ctxT(t)
	w := &gcWatch{Backend: b, polled: make(chan struct{}, 1)}
	r := repo.New(w, repo.Options{LeaseTTL: time.Hour, PollInterval: 20 * time.Millisecond})
	m := NewManifest(t, r, "snap", 13)
	marker := []byte(`{}`)
	if err := b.Put(ctx, "gc/other-node", bytes.NewReader(marker), 2, nil); err != nil {
		t.Fatal(err)
	}
	// A commit that gives up while waiting says why and leaves no lease.
	short, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Commit(short, m) }()
	// The lease is in the store once its PUT is, which may be before the
	// commit's PUT returned: cancel once the commit looks for the gc.
	w.waitPoll(t)
	cancel()
	if err := <-done; err == nil || !strings.Contains(err.Error(), "garbage collection") {
		t.Fatalf("commit while a gc runs: %v, want it to wait for the gc", err)
	}
	if leases, _ := b.List(ctx, "leases/"); len(leases) != 0 {
		t.Fatalf("the commit that gave up left its lease: %v", leases)
	}
	go func() { done <- r.Commit(ctx, m) }()
	waitLease(t, b)
	time.Sleep(100 * time.Millisecond) // several polls of the waiting commit
	if _, err := r.Manifest(ctx, "snap"); !errors.Is(err, repo.ErrNotFound) {
		t.Fatalf("the manifest was committed while a gc ran: %v", err)
	}
	if err := b.Delete(ctx, "gc/other-node"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("commit after the gc: %v", err)
	}
	if _, err := r.Manifest(ctx, "snap"); err != nil {
		t.Fatal(err)
	}
}

// testGCRace commits manifests that each reuse an old blob while GC runs in
// a loop. The old blobs are held by leases of the test until their round,
// which drops the lease right before the commit: from then on GC may
// collect the blob (its grace period protects only the blobs each round
// uploads fresh). Each commit either fails (the blob was collected first) or
// its manifest's blobs are all present afterwards.
func testGCRace(t *testing.T, b repo.Backend) {
	ctx := ctxT(t)
	r := repo.New(b, repo.Options{PollInterval: 5 * time.Millisecond})
	const rounds = 10
	const grace = 2 * time.Second
	var shared []repo.Blob
	for i := range rounds {
		shared = append(shared, PutRandom(t, r, 5000+uint64(i), 2000))
		putLease(t, b, fmt.Sprintf("leases/test-%d", i), shared[i].Digest)
	}
	time.Sleep(grace + 100*time.Millisecond) // the shared blobs are past the grace period
	var wg sync.WaitGroup
	stop := make(chan struct{})
	var gcErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := r.GC(ctx, repo.GCOptions{Grace: grace}); err != nil {
				gcErr = err
				return
			}
			// A gap between runs lets some commits land between them, and
			// others meet a run: both paths get exercised.
			time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
		}
	}()
	committed := 0
	for i := range rounds {
		m := NewManifest(t, r, fmt.Sprintf("race-%d", i), uint64(100+i))
		m.Rootfs[0].Blob = shared[i] // unreferenced until this commit lands
		if err := b.Delete(ctx, fmt.Sprintf("leases/test-%d", i)); err != nil {
			t.Fatal(err)
		}
		err := r.Commit(ctx, m)
		if err != nil && !errors.Is(err, repo.ErrMissingBlob) {
			t.Fatalf("commit %d: %v", i, err)
		}
		if err == nil {
			committed++
		}
	}
	close(stop)
	wg.Wait()
	if gcErr != nil {
		t.Fatalf("gc: %v", gcErr)
	}
	if _, err := r.GC(ctx, repo.GCOptions{}); err != nil {
		t.Fatal(err)
	}
	names, _ := r.Manifests(ctx)
	if len(names) != committed {
		t.Fatalf("%d manifests listed, %d commits succeeded", len(names), committed)
	}
	for _, name := range names {
		m, err := r.Manifest(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		for _, bl := range m.Blobs() {
			if _, err := r.StatBlob(ctx, bl.Digest); err != nil {
				t.Fatalf("manifest %s points at a collected blob %s: %v", name, bl.Digest, err)
			}
		}
	}
	t.Logf("%d of %d commits landed while gc ran", committed, rounds)
}

// testWorkingSets: a layer's working-set hint reads back, a damaged one is
// refused, and GC keeps the hints of kept layers and drops the others'.
func testWorkingSets(t *testing.T, b repo.Backend) {
	ctx := ctxT(t)
	r := repo.New(b, repo.Options{})
	keep := NewManifest(t, r, "keep", 20)
	drop := NewManifest(t, r, "drop", 21)
	for _, m := range []*repo.Manifest{keep, drop} {
		if err := r.Commit(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	kl, dl := keep.Memory[0], drop.Memory[0] // 4096 bytes: 4 blocks of 1 KiB
	want := []int64{2, 0, 3}
	// Memory working sets an earlier version kept as hints.
	stack := []byte(`{"size":8192,"extents":[{"off":0,"len":4096}]}`)
	oldHint := func(l repo.Layer) string { return "hints/memory/" + l.Digest.Hex() }
	for _, l := range []repo.Layer{kl, dl} {
		if err := r.PutWorkingSet(ctx, l, 1024, want); err != nil {
			t.Fatal(err)
		}
		if err := b.Put(ctx, oldHint(l), bytes.NewReader(stack), int64(len(stack)), nil); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := r.WorkingSet(ctx, kl, 1024); err != nil || !slices.Equal(got, want) {
		t.Fatalf("working set read back: %v, %v", got, err)
	}
	if _, err := r.WorkingSet(ctx, kl, 2048); !errors.Is(err, repo.ErrInvalid) {
		t.Fatalf("working set read with another block size: %v", err)
	}
	if err := r.PutWorkingSet(ctx, kl, 1024, []int64{9}); !errors.Is(err, repo.ErrInvalid) {
		t.Fatalf("a working set past the layer's end: %v", err)
	}
	if _, err := r.WorkingSet(ctx, keep.Rootfs[0], 1024); !errors.Is(err, repo.ErrNotFound) {
		t.Fatalf("a layer without a hint: %v", err)
	}
	if err := r.DeleteManifest(ctx, "drop"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.GC(ctx, repo.GCOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.WorkingSet(ctx, kl, 1024); err != nil {
		t.Fatalf("gc dropped the hint of a kept layer: %v", err)
	}
	if _, err := r.WorkingSet(ctx, dl, 1024); !errors.Is(err, repo.ErrNotFound) {
		t.Fatalf("gc kept the hint of a collected layer: %v", err)
	}
	if _, err := b.Stat(ctx, oldHint(kl)); err != nil {
		t.Fatalf("gc dropped an earlier version's memory working set of a kept layer: %v", err)
	}
	if _, err := b.Stat(ctx, oldHint(dl)); !errors.Is(err, repo.ErrNotFound) {
		t.Fatalf("gc kept an earlier version's memory working set of a collected layer: %v", err)
	}
	garbage := []byte("AENVWS01\x00\x00\x04\x00\xff\xff\xff\xff")
	if err := b.Put(ctx, "hints/workingset/"+kl.Digest.Hex(), bytes.NewReader(garbage), int64(len(garbage)), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := r.WorkingSet(ctx, kl, 1024); !errors.Is(err, repo.ErrInvalid) {
		t.Fatalf("a damaged hint: %v", err)
	}
}
