package reponode

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/config"
	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/snapshot/repo/repotest"
	"github.com/agentenv/agentenv/snapshot/repo/s3/s3test"
	"github.com/agentenv/agentenv/snapshot/repo/upload"
	"github.com/agentenv/agentenv/storage/blob"
)

func write(t *testing.T, dir, name string, n int, seed uint64) string {
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, repotest.Random(seed, n), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestTwoNodesShareABucket: node A commits a snapshot to a real S3 bucket
// in the background; node B, sharing the bucket and with A as its peer,
// reads the snapshot's layers through A (verified), and from the store once
// A no longer serves them.
func TestTwoNodesShareABucket(t *testing.T) {
	srv := s3test.Start(t)
	bucket := srv.Bucket(t)
	nodeCfg := func(peers ...string) config.Config {
		c := config.Default()
		c.DataDir = t.TempDir()
		c.Repository.Backend, c.Repository.Endpoint, c.Repository.Bucket = "s3", bucket.Endpoint, bucket.Bucket
		c.Repository.AccessKey, c.Repository.SecretKey, c.Repository.PathStyle = bucket.AccessKey, bucket.SecretKey, true
		c.Repository.PeerListen, c.Repository.Peers, c.Repository.PeerToken = "127.0.0.1:0", peers, "tok"
		c.Repository.ChunkSizeKiB = 64
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		return c
	}
	ctx := context.Background()
	a, err := Open(ctx, nodeCfg())
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer a.Close()

	dir := t.TempDir()
	job := upload.Job{Name: "snap-on-a", Kind: repo.KindSnapshot, Created: time.Now().UTC(),
		Rootfs: []string{write(t, dir, "rootfs-1.lsmt", 500000, 1)}, Memory: []string{write(t, dir, "memory-1.lsmt", 300000, 2)},
		State: write(t, dir, "state", 1000, 3), Config: write(t, dir, "config.json", 100, 4)}
	if err := a.Commit(ctx, job); err != nil {
		t.Fatal(err)
	}
	st, err := a.Uploads.Wait(ctx, job.Name)
	if err != nil || st.State != upload.Uploaded {
		t.Fatalf("upload on A: %+v, %v", st, err)
	}
	if got, ok := a.Status(job.Name); !ok || got.State != upload.Uploaded {
		t.Fatalf("status on A: %+v", got)
	}

	b, err := Open(ctx, nodeCfg("http://"+a.PeerAddr()))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	m, err := b.Repo.Manifest(ctx, job.Name)
	if err != nil {
		t.Fatalf("B reads A's manifest: %v", err)
	}
	mem := m.Memory[0]
	want, _ := os.ReadFile(job.Memory[0])
	read := func() []int64 {
		c, err := b.OpenLayer(ctx, mem)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		got := make([]byte, len(want))
		if _, err := c.ReadAt(got, 0); err != nil || !bytes.Equal(got, want) {
			t.Fatalf("B reads the memory layer: %v", err)
		}
		fetched, _ := c.Source().(*blob.Verified).Fetched()
		return fetched
	}
	if fetched := read(); len(fetched) != 1 || fetched[0] != int64(len(want)) {
		t.Fatalf("with A not serving the layer, fetched %v: want one source (the store), all of it", fetched)
	}
	a.Held.Add(mem.Digest, job.Memory[0])
	if fetched := read(); len(fetched) != 2 || fetched[0] != int64(len(want)) || fetched[1] != 0 {
		t.Fatalf("with A serving the layer, fetched %v: want all from A", fetched)
	}
	// A restore on B records what it read; the next one prefetches it and
	// then reads without a miss.
	rec, err := b.OpenRecorded(ctx, mem)
	if err != nil {
		t.Fatal(err)
	}
	offsets := []int64{200000, 5, 70000, 140000}
	for _, off := range offsets {
		if _, err := rec.ReadAt(make([]byte, 10), off); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.RecordWorkingSet(ctx, mem, rec); err != nil {
		t.Fatal(err)
	}
	next, err := b.OpenLayer(ctx, mem)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Prefetch(ctx, mem, next); err != nil {
		t.Fatal(err)
	}
	for _, off := range offsets {
		got := make([]byte, 10)
		if _, err := next.ReadAt(got, off); err != nil || !bytes.Equal(got, want[off:off+10]) {
			t.Fatalf("read at %d after prefetch: %v", off, err)
		}
	}
	if _, misses, _ := next.Stats(); misses != 0 {
		t.Fatalf("%d misses after prefetching the recorded working set", misses)
	}
	if used := b.CacheUsed(); used == 0 || used > 2*int64(len(want))+2*64<<10 {
		t.Fatalf("the node's block cache holds %d bytes with two layers open", used)
	}
	rec.Close()
	next.Close()
	if used := b.CacheUsed(); used != 0 {
		t.Fatalf("the node's block cache holds %d bytes with no layer open", used)
	}
	// B keeps the layer local and serves it in turn: C reads it from B.
	local, err := b.Fetch(ctx, mem, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(local); !bytes.Equal(got, want) {
		t.Fatal("the fetched layer differs")
	}
	cNode, err := Open(ctx, nodeCfg("http://"+b.PeerAddr()))
	if err != nil {
		t.Fatal(err)
	}
	defer cNode.Close()
	a.Held.Remove(mem.Digest)
	srcs := cNode.Peers.Sources(ctx, mem.Blob)
	if len(srcs) != 1 {
		t.Fatalf("C sees %d peers holding the layer, want B", len(srcs))
	}
	// GC on B keeps what A's manifest references.
	if st, err := b.Repo.GC(ctx, repo.GCOptions{}); err != nil || len(st.Deleted) != 0 || st.Referenced != len(m.Blobs()) {
		t.Fatalf("gc: %+v, %v", st, err)
	}
}

// TestOpenFromConfig: a posix repository under the data directory, "none"
// (the default), and one clear error for rejected credentials.
func TestOpenFromConfig(t *testing.T) {
	c := config.Default()
	c.DataDir = t.TempDir()
	if n, err := Open(context.Background(), c); n != nil || err != nil {
		t.Fatalf("default (none): %v, %v", n, err)
	}
	c.Repository.Backend = "posix"
	n, err := Open(context.Background(), c)
	if err != nil || n == nil {
		t.Fatalf("posix: %v", err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n.PeerAddr() != "" {
		t.Fatalf("peer endpoint on by default: %s", n.PeerAddr())
	}
	n.Close()
	if _, err := os.Stat(filepath.Join(c.DataDir, "repository")); err != nil {
		t.Fatalf("no repository directory under the data directory: %v", err)
	}
	c.Repository.Backend = "none"
	if n, err := Open(context.Background(), c); n != nil || err != nil {
		t.Fatalf("backend none: %v, %v", n, err)
	}
	srv := s3test.Start(t)
	bucket := srv.Bucket(t)
	c.Repository.Backend, c.Repository.Endpoint, c.Repository.Bucket = "s3", bucket.Endpoint, bucket.Bucket
	c.Repository.AccessKey, c.Repository.SecretKey, c.Repository.PathStyle = bucket.AccessKey, "not-the-secret", true
	if _, err := Open(context.Background(), c); err == nil || !strings.Contains(err.Error(), "rejected the credentials") {
		t.Fatalf("wrong secret: %v", err)
	}
}
