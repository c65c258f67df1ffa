package reponode

import (
	"context"
	"testing"
	"time"

	"github.com/agentenv/agentenv/config"
	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/snapshot/repo/repotest"
	"github.com/agentenv/agentenv/snapshot/repo/upload"
)

// TestPeriodicGC: with gc_interval set, the node collects on its own: a
// blob no manifest references goes (grace 0), every blob of a committed
// manifest stays; with gc_interval 0 (off) nothing is collected.
func TestPeriodicGC(t *testing.T) {
	ctx := context.Background()
	open := func(dataDir string, every time.Duration) *Node {
		c := config.Default()
		c.DataDir, c.Repository.Backend = dataDir, "posix"
		c.Repository.GCGrace, c.Repository.GCInterval = config.Duration{}, config.Duration{Duration: every}
		if err := c.Validate(); err != nil {
			t.Fatal(err)
		}
		n, err := Open(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		if err := n.Start(ctx); err != nil {
			t.Fatal(err)
		}
		return n
	}
	dataDir := t.TempDir()
	// Off: a loose blob survives a node's lifetime.
	off := open(dataDir, 0)
	loose := repotest.PutRandom(t, off.Repo, 21, 4096)
	dir := t.TempDir()
	job := upload.Job{Name: "kept", Kind: repo.KindSnapshot, Created: time.Now().UTC(),
		Rootfs: []string{write(t, dir, "rootfs.lsmt", 70000, 22)}, Memory: []string{write(t, dir, "memory.lsmt", 50000, 23)},
		State: write(t, dir, "state", 300, 24), Config: write(t, dir, "config.json", 40, 25)}
	if err := off.Commit(ctx, job); err != nil {
		t.Fatal(err)
	}
	if st, err := off.Uploads.Wait(ctx, job.Name); err != nil || st.State != upload.Uploaded {
		t.Fatalf("upload: %+v, %v", st, err)
	}
	if err := off.Close(); err != nil {
		t.Fatal(err)
	}
	if off.GCRuns() != 0 {
		t.Fatalf("gc_interval 0 ran %d collections", off.GCRuns())
	}
	if _, err := off.Repo.StatBlob(ctx, loose.Digest); err != nil {
		t.Fatalf("the loose blob went with collection off: %v", err)
	}

	on := open(dataDir, 10*time.Millisecond)
	defer on.Close()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for on.GCRuns() == 0 {
		if wctx.Err() != nil {
			t.Fatal("no periodic collection ran")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := on.Repo.StatBlob(ctx, loose.Digest); err == nil {
		t.Fatalf("a periodic collection kept blob %s, which nothing references", loose.Digest)
	}
	m, err := on.Repo.Manifest(ctx, job.Name)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range m.Blobs() {
		if _, err := on.Repo.StatBlob(ctx, b.Digest); err != nil {
			t.Fatalf("a periodic collection removed blob %s of manifest %s: %v", b.Digest, m.Name, err)
		}
	}
}
