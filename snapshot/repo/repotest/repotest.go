// Package repotest is the conformance suite of snapshot repository backends
// (in the style of containerd's snapshotter test suite): every check runs on
// a fresh, empty backend from the caller's factory, through the repository
// protocol of package repo and through the Backend contract directly.
package repotest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/snapshot/repo"
)

// Factory returns a fresh, empty backend for one check; it registers its
// own cleanup with t.
type Factory func(t *testing.T) repo.Backend

// Run runs every check of the suite against backends from f.
func Run(t *testing.T, f Factory) {
	checks := []struct {
		name string
		fn   func(t *testing.T, b repo.Backend)
	}{
		{"BackendPutGetStatList", testBackendBasics},
		{"BackendPutCheckFails", testBackendCheckFails},
		{"BlobRoundTripAndRanges", testBlobRanges},
		{"BlobWrongDigestInvisible", testBlobWrongDigest},
		{"BlobShortOrLongSource", testBlobWrongLength},
		{"BlobFailingSourceInvisible", testBlobFailingSource},
		{"BlobPresentNotUploadedAgain", testBlobIdempotent},
		{"CommitGetListDelete", testCommit},
		{"CommitRefusesMissingBlob", testCommitMissing},
		{"CommitIdempotentAndConflict", testCommitConflict},
		{"ManifestFromStoreIsValidated", testManifestUntrusted},
		{"GCKeepsReferencedRemovesRest", testGC},
		{"GCHonoursLeases", testGCLeases},
		{"CommitWaitsForGC", testCommitWaitsForGC},
		{"GCNeverRacesCommits", testGCRace},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t, f(t))
		})
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Random returns n deterministic pseudo-random bytes of stream seed.
func Random(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// PutRandom stores a random blob of n bytes and returns its descriptor.
func PutRandom(t testing.TB, r repo.Repository, seed uint64, n int) repo.Blob {
	t.Helper()
	data := Random(seed, n)
	d := repo.DigestOf(data)
	if err := r.PutBlob(context.Background(), d, int64(n), bytes.NewReader(data)); err != nil {
		t.Fatalf("put blob: %v", err)
	}
	return repo.Blob{Digest: d, Size: int64(n)}
}

// NewManifest stores the blobs of a small manifest (two rootfs layers, one
// memory layer, their chunk tables as opaque blobs, state, config), seeded
// by seed, and returns it uncommitted.
func NewManifest(t testing.TB, r repo.Repository, name string, seed uint64) *repo.Manifest {
	t.Helper()
	layer := func(s uint64, n int) repo.Layer {
		return repo.Layer{Blob: PutRandom(t, r, s, n), Chunks: PutRandom(t, r, s+1000, 64)}
	}
	return &repo.Manifest{
		Schema: repo.SchemaVersion, Name: name, Kind: repo.KindSnapshot,
		Created: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Rootfs:  []repo.Layer{layer(seed*10+1, 3000), layer(seed*10+2, 5000)},
		Memory:  []repo.Layer{layer(seed*10+3, 4096)},
		State:   PutRandom(t, r, seed*10+4, 300),
		Config:  PutRandom(t, r, seed*10+5, 100),
	}
}

func readAll(t *testing.T) func(io.ReadCloser, error) []byte {
	return func(rc io.ReadCloser, err error) []byte {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		b, err := io.ReadAll(rc)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
}

func testBackendBasics(t *testing.T, b repo.Backend) {
	ctx := ctxT(t)
	for i, k := range []string{"a/x", "a/y/z", "b/x"} {
		data := []byte(strings.Repeat(k, i+1))
		if err := b.Put(ctx, k, bytes.NewReader(data), int64(len(data)), nil); err != nil {
			t.Fatal(err)
		}
	}
	got := readAll(t)(b.Get(ctx, "a/y/z", 2, 5))
	if string(got) != "y/za/" {
		t.Fatalf("range read = %q, want %q", got, "y/za/")
	}
	if got := readAll(t)(b.Get(ctx, "a/y/z", 4, -1)); string(got) != "za/y/z" {
		t.Fatalf("read to end = %q", got)
	}
	info, err := b.Stat(ctx, "b/x")
	if err != nil || info.Size != 9 || info.ModTime.IsZero() {
		t.Fatalf("stat = %+v, %v", info, err)
	}
	objs, err := b.List(ctx, "a/")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, o := range objs {
		keys = append(keys, o.Key)
	}
	slices.Sort(keys)
	if !slices.Equal(keys, []string{"a/x", "a/y/z"}) {
		t.Fatalf("list a/ = %v", keys)
	}
	if _, err := b.Stat(ctx, "a/missing"); !errors.Is(err, repo.ErrNotFound) {
		t.Fatalf("stat of a missing key: %v, want ErrNotFound", err)
	}
	if _, err := b.Get(ctx, "a/missing", 0, -1); !errors.Is(err, repo.ErrNotFound) {
		t.Fatalf("get of a missing key: %v, want ErrNotFound", err)
	}
	if err := b.Delete(ctx, "a/x"); err != nil {
		t.Fatal(err)
	}
	if err := b.Delete(ctx, "a/x"); err != nil {
		t.Fatalf("deleting a missing key: %v", err)
	}
	if _, err := b.Stat(ctx, "a/x"); !errors.Is(err, repo.ErrNotFound) {
		t.Fatalf("stat after delete: %v", err)
	}
}

func testBackendCheckFails(t *testing.T, b repo.Backend) {
	ctx := ctxT(t)
	data := Random(1, 100000)
	bad := errors.New("refused by check")
	err := b.Put(ctx, "k/obj", bytes.NewReader(data), int64(len(data)), func() error { return bad })
	if !errors.Is(err, bad) {
		t.Fatalf("put with a failing check: %v", err)
	}
	if _, err := b.Stat(ctx, "k/obj"); !errors.Is(err, repo.ErrNotFound) {
		t.Fatalf("the refused object is visible: %v", err)
	}
	if objs, _ := b.List(ctx, "k/"); len(objs) != 0 {
		t.Fatalf("the refused put left %v", objs)
	}
	called := false
	if err := b.Put(ctx, "k/obj", bytes.NewReader(data), int64(len(data)), func() error { called = true; return nil }); err != nil || !called {
		t.Fatalf("put with a passing check: %v (check called %v)", err, called)
	}
	if got := readAll(t)(b.Get(ctx, "k/obj", 0, -1)); !bytes.Equal(got, data) {
		t.Fatal("the object read back differs")
	}
}

func testBlobRanges(t *testing.T, b repo.Backend) {
	ctx := ctxT(t)
	r := repo.New(b, repo.Options{})
	data := Random(2, 300000)
	d := repo.DigestOf(data)
	if err := r.PutBlob(ctx, d, int64(len(data)), bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if n, err := r.StatBlob(ctx, d); err != nil || n != int64(len(data)) {
		t.Fatalf("stat blob = %d, %v", n, err)
	}
	for _, c := range []struct{ off, n int64 }{{0, -1}, {0, 1}, {12345, 4096}, {299999, 1}, {100000, -1}, {0, 300000}} {
		want := data[c.off:]
		if c.n >= 0 {
			want = want[:c.n]
		}
		got := readAll(t)(r.ReadBlob(ctx, d, c.off, c.n))
		if !bytes.Equal(got, want) {
			t.Fatalf("read [%d,+%d): %d bytes, differ from the blob", c.off, c.n, len(got))
		}
	}
	if _, err := r.StatBlob(ctx, repo.DigestOf([]byte("absent"))); !errors.Is(err, repo.ErrNotFound) {
		t.Fatalf("stat of an absent blob: %v", err)
	}
	if _, err := r.StatBlob(ctx, "sha256:../../etc"); !errors.Is(err, repo.ErrInvalid) {
		t.Fatalf("stat of a malformed digest: %v", err)
	}
}

func assertNoBlobs(t *testing.T, b repo.Backend) {
	t.Helper()
	objs, err := b.List(context.Background(), "blobs/")
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 0 {
		t.Fatalf("blobs visible after a refused put: %v", objs)
	}
}

func testBlobWrongDigest(t *testing.T, b repo.Backend) {
	r := repo.New(b, repo.Options{})
	data := Random(3, 70000)
	claimed := repo.DigestOf(Random(4, 70000))
	err := r.PutBlob(ctxT(t), claimed, int64(len(data)), bytes.NewReader(data))
	if !errors.Is(err, repo.ErrDigestMismatch) || !strings.Contains(err.Error(), string(claimed)) {
		t.Fatalf("put under a wrong digest: %v", err)
	}
	assertNoBlobs(t, b)
}

func testBlobWrongLength(t *testing.T, b repo.Backend) {
	r := repo.New(b, repo.Options{})
	data := Random(5, 50000)
	d := repo.DigestOf(data)
	if err := r.PutBlob(ctxT(t), d, int64(len(data))+10, bytes.NewReader(data)); err == nil {
		t.Fatal("put accepted a source shorter than its size")
	}
	if err := r.PutBlob(ctxT(t), d, int64(len(data))-10, bytes.NewReader(data)); !errors.Is(err, repo.ErrDigestMismatch) {
		t.Fatalf("put of a source longer than its size: %v", err)
	}
	assertNoBlobs(t, b)
}

// failingReader gives n bytes of data and then an error (a dying source).
type failingReader struct {
	data []byte
	n    int
}

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, errors.New("source died")
	}
	k := copy(p[:min(len(p), f.n)], f.data)
	f.data, f.n = f.data[k:], f.n-k
	return k, nil
}

func testBlobFailingSource(t *testing.T, b repo.Backend) {
	r := repo.New(b, repo.Options{})
	data := Random(6, 200000)
	d := repo.DigestOf(data)
	if err := r.PutBlob(ctxT(t), d, int64(len(data)), &failingReader{data: data, n: 100000}); err == nil {
		t.Fatal("put succeeded from a source that died half way")
	}
	assertNoBlobs(t, b)
	ctx, cancel := context.WithCancel(ctxT(t))
	cancel()
	if err := r.PutBlob(ctx, d, int64(len(data)), bytes.NewReader(data)); err == nil {
		t.Fatal("put succeeded with a cancelled context")
	}
	assertNoBlobs(t, b)
}

// unreadable fails the test when read: the blob is present, so the put must
// not read its source.
type unreadable struct{ t *testing.T }

func (u unreadable) Read([]byte) (int, error) {
	u.t.Error("the source of a blob already present was read")
	return 0, io.EOF
}

func testBlobIdempotent(t *testing.T, b repo.Backend) {
	r := repo.New(b, repo.Options{})
	blob := PutRandom(t, r, 7, 1000)
	if err := r.PutBlob(ctxT(t), blob.Digest, blob.Size, unreadable{t}); err != nil {
		t.Fatal(err)
	}
}

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

func testCommitWaitsForGC(t *testing.T, b repo.Backend) {
	ctx := ctxT(t)
	r := repo.New(b, repo.Options{LeaseTTL: time.Hour, PollInterval: 20 * time.Millisecond})
	m := NewManifest(t, r, "snap", 13)
	marker := []byte(`{}`)
	if err := b.Put(ctx, "gc/other-node", bytes.NewReader(marker), 2, nil); err != nil {
		t.Fatal(err)
	}
	// A commit that gives up while waiting says why and leaves no lease.
	short, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Commit(short, m) }()
	waitLease(t, b)
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

// testGCRace commits manifests that reuse an old unreferenced blob while GC
// runs with no grace period: each commit either fails (the blob was
// collected first) or its manifest's blobs are all present afterwards.
func testGCRace(t *testing.T, b repo.Backend) {
	ctx := ctxT(t)
	r := repo.New(b, repo.Options{PollInterval: 5 * time.Millisecond})
	const rounds = 12
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
			if _, err := r.GC(ctx, repo.GCOptions{}); err != nil {
				gcErr = err
				return
			}
		}
	}()
	committed := 0
	for i := range rounds {
		m := NewManifest(t, r, fmt.Sprintf("race-%d", i), uint64(100+i))
		// The shared layer: unreferenced until this commit lands.
		shared := PutRandom(t, r, 5000+uint64(i), 2000)
		m.Rootfs[0].Blob = shared
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
