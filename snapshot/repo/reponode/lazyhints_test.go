package reponode

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/snapshot/repo/repotest"
	"github.com/agentenv/agentenv/snapshot/repo/s3/s3test"
	"github.com/agentenv/agentenv/storage/blob"
)

// TestLayerHints: the first node to read a layer lazily records the blocks
// it read as the layer's hint once the layer is local; a second node
// sharing the bucket, opening the layer at its first read, fetches the
// hinted blocks ahead of its reads, which then cost no fetch.
func TestLayerHints(t *testing.T) {
	srv := s3test.Start(t)
	bucket := srv.Bucket(t)
	ctx := context.Background()
	open := func() *Node {
		n, dir := s3Node(t, bucket)
		if err := n.ServeLayers(ctx, filepath.Join(dir, "layers.sock")); err != nil {
			t.Fatal(err)
		}
		return n
	}
	const chunk = 64 << 10
	first := open()
	data := repotest.Random(11, 256*chunk)
	p := filepath.Join(t.TempDir(), "layer")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := repo.PutLayerFile(ctx, first.Repo, p, chunk)
	if err != nil {
		t.Fatal(err)
	}
	read := func(n *Node, blocks ...int64) {
		t.Helper()
		b, err := blob.Open(ctx, n.LazyURL(l, repo.UseRootfs), blob.HTTPOptions{})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		for _, k := range blocks {
			got := make([]byte, 100)
			if _, err := b.ReadAt(got, k*chunk+7); err != nil || !bytes.Equal(got, data[k*chunk+7:k*chunk+107]) {
				t.Fatalf("read of block %d: %v", k, err)
			}
		}
	}
	hinted := []int64{200, 10, 50}
	read(first, hinted...)
	if _, err := first.Repo.WorkingSet(ctx, l, chunk); err == nil {
		t.Fatal("a hint was recorded while the layer was still read lazily")
	}
	if _, err := first.Fetch(ctx, l, t.TempDir()); err != nil { // local now: the lazy reads are over
		t.Fatal(err)
	}
	// The hint is what the socket served, in the order of first reads: the
	// blocks asked for and what the reader's own read-ahead asked with them.
	got, err := first.Repo.WorkingSet(ctx, l, chunk)
	at := func(k int64) int { return slices.Index(got, k) }
	if err != nil || at(200) < 0 || at(10) <= at(200) || at(50) <= at(10) || len(got) > 4*len(hinted)+1 {
		t.Fatalf("recorded hint %v (%v), want the blocks read (%v) in that order and little else", got, err, hinted)
	}

	second := open()
	read(second, hinted[0]) // opens the layer: the prefetch of the rest starts
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := second.hintPrefetched(wctx, l.Digest); err != nil {
		t.Fatalf("the prefetch of the hint did not end: %v", err)
	}
	if f := second.LazyFetched(); f < int64(len(got))*chunk {
		t.Fatalf("the second node fetched %d bytes; the hint names %d blocks of %d", f, len(got), chunk)
	}
	before := second.LazyFetched()
	read(second, hinted[1:]...)
	if after := second.LazyFetched(); after != before {
		t.Fatalf("reads of hinted blocks fetched %d more bytes; the prefetch had them", after-before)
	}
}
