// Package repotest is the conformance suite of snapshot repository backends
// (in the style of containerd's snapshotter test suite): every check runs on
// a fresh, empty backend from the caller's factory, through the repository
// protocol of package repo and through the Backend contract directly.
package repotest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
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
		{"WorkingSetHints", testWorkingSets},
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
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	b := make([]byte, n)
	_, _ = rand.NewChaCha8(key).Read(b)
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
	ws := PutRandom(t, r, seed*10+6, 700)
	return &repo.Manifest{
		Schema: repo.SchemaVersion, Name: name, Kind: repo.KindSnapshot,
		Created: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Rootfs:  []repo.Layer{layer(seed*10+1, 3000), layer(seed*10+2, 5000)},
		Memory:  []repo.Layer{layer(seed*10+3, 4096)},
		State:   PutRandom(t, r, seed*10+4, 300),
		Config:  PutRandom(t, r, seed*10+5, 100),
		// A working-set pack: GC keeps it with the manifest (Blobs).
		WorkingSet: &ws,
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
