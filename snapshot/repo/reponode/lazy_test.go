package reponode

import (
	"bytes"
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/config"
	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/snapshot/repo/repotest"
	"github.com/agentenv/agentenv/snapshot/repo/s3"
	"github.com/agentenv/agentenv/snapshot/repo/s3/s3test"
	"github.com/agentenv/agentenv/storage/blob"
)

// TestLayerSocket: a layer in a real S3 bucket is read the way the storage
// daemon reads a lazy lower (blob.Open of its http+unix URL): the bytes are
// the layer's, a few reads fetch a few chunks and not the layer, and once
// the node fetched the layer whole the socket reads its file (no more
// store traffic). A layer whose stored object was damaged behind the
// store's back fails its reads with an error naming its digest, and serves
// no byte of the damaged chunk; its undamaged chunks still read.
func TestLayerSocket(t *testing.T) {
	srv := s3test.Start(t)
	bucket := srv.Bucket(t)
	ctx := context.Background()
	n, dir := s3Node(t, bucket)
	if got := n.LazyURL(repo.Layer{}, repo.UseRootfs); got != "" {
		t.Fatalf("a LazyURL before the socket serves: %q", got)
	}
	if err := n.ServeLayers(ctx, filepath.Join(dir, "layers.sock")); err != nil {
		t.Fatal(err)
	}
	const chunk = 64 << 10
	put := func(seed uint64, size int) (repo.Layer, []byte) {
		data := repotest.Random(seed, size)
		p := filepath.Join(t.TempDir(), "layer")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		l, err := repo.PutLayerFile(ctx, n.Repo, p, chunk)
		if err != nil {
			t.Fatal(err)
		}
		return l, data
	}
	l, data := put(7, 256*chunk+123)
	url := n.LazyURL(l, repo.UseRootfs)
	if got, ok := LazyLayer(url); !ok || got != l {
		t.Fatalf("LazyLayer(%q) = %+v %v", url, got, ok)
	}
	if d, ok := blob.URLDigest(url); !ok || d != string(l.Digest) {
		t.Fatalf("the URL names %q, not the layer's digest", d)
	}
	b, err := blob.Open(ctx, url, blob.HTTPOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, off := range []int64{0, 17 * chunk, 40*chunk + 5, int64(len(data)) - 100} {
		got := make([]byte, 100)
		if _, err := b.ReadAt(got, off); err != nil || !bytes.Equal(got, data[off:off+100]) {
			t.Fatalf("read at %d: %v", off, err)
		}
	}
	if f := n.LazyFetched(); f == 0 || f > int64(len(data))/4 {
		t.Fatalf("four small reads fetched %d of the layer's %d bytes", f, len(data))
	}
	if _, err := n.Fetch(ctx, l, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	if n.FetchedWhole() != int64(len(data)) {
		t.Fatalf("Fetch read %d bytes of a %d-byte layer", n.FetchedWhole(), len(data))
	}
	before := n.LazyFetched()
	whole := make([]byte, len(data))
	if _, err := b.ReadAt(whole, 0); err != nil || !bytes.Equal(whole, data) {
		t.Fatalf("read of the whole layer after the fetch: %v", err)
	}
	if n.LazyFetched() != before {
		t.Fatal("the socket went to the store for a layer the node holds")
	}

	bad, badData := put(8, 16*chunk)
	obj := srv.ObjectPath(bucket.Bucket, repo.BlobKey(bad.Digest))
	damaged := bytes.Clone(badData)
	damaged[5*chunk+10] ^= 1
	if err := os.WriteFile(obj, damaged, 0o600); err != nil {
		t.Fatal(err)
	}
	bb, err := blob.Open(ctx, n.LazyURL(bad, repo.UseRootfs), blob.HTTPOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer bb.Close()
	buf := bytes.Repeat([]byte{0x55}, chunk)
	k, err := bb.ReadAt(buf, 5*chunk)
	if err == nil || k != 0 || !strings.Contains(err.Error(), bad.Digest.Hex()) || !strings.Contains(err.Error(), "422") {
		t.Fatalf("read of the damaged chunk: %d bytes, %v", k, err)
	}
	if !bytes.Equal(buf, bytes.Repeat([]byte{0x55}, chunk)) && !bytes.Equal(buf, make([]byte, chunk)) {
		t.Fatal("bytes of the damaged chunk reached the reader")
	}
	got := make([]byte, chunk)
	if _, err := bb.ReadAt(got, 9*chunk); err != nil || !bytes.Equal(got, badData[9*chunk:10*chunk]) {
		t.Fatalf("an undamaged chunk of the damaged layer: %v", err)
	}
	// The node reads it through its own cache the same way.
	if err := n.readLazy(bad, repo.UseRootfs, make([]byte, 10), 5*chunk); !errors.Is(err, blob.ErrCorrupt) || !strings.Contains(err.Error(), string(bad.Digest)) {
		t.Fatalf("readLazy of the damaged chunk: %v", err)
	}
	// Asked why a VM mapping it ended, the node names the layer and the
	// read; the good layer had no failed read.
	if err := n.LazyFailure(n.LazyURL(bad, repo.UseRootfs)); !errors.Is(err, blob.ErrCorrupt) || !strings.Contains(err.Error(), string(bad.Digest)) {
		t.Fatalf("LazyFailure of the damaged layer: %v", err)
	}
	if err := n.LazyFailure(url); err != nil {
		t.Fatalf("LazyFailure of a layer whose reads all worked: %v", err)
	}
	if err := n.LazyFailure("not a url"); err != nil {
		t.Fatalf("LazyFailure of no layer: %v", err)
	}
}

// TestLazyCostsByUse: reads of a layer through a memory URL are counted
// under memory, none under rootfs; what was fetched is exactly the blocks
// read (no hint recorded yet; memory layers read nothing ahead, their
// mount reads around), while a rootfs layer read in sequence reads ahead
// and fetches no more than that and what was read.
// A URL naming an unknown use is refused.
func TestLazyCostsByUse(t *testing.T) {
	srv := s3test.Start(t)
	ctx := context.Background()
	n, dir := s3Node(t, srv.Bucket(t))
	if err := n.ServeLayers(ctx, filepath.Join(dir, "layers.sock")); err != nil {
		t.Fatal(err)
	}
	data := repotest.Random(9, 8<<20)
	p := filepath.Join(t.TempDir(), "layer")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := repo.PutLayerFile(ctx, n.Repo, p, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data[:4<<20], 0o600); err != nil {
		t.Fatal(err)
	}
	l2, err := repo.PutLayerFile(ctx, n.Repo, p, 64<<10)
	if err != nil {
		t.Fatal(err)
	}
	b, err := blob.Open(ctx, n.LazyURL(l, repo.UseMemory), blob.HTTPOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	read := func(off, size int64) {
		t.Helper()
		got := make([]byte, size)
		if _, err := b.ReadAt(got, off); err != nil || !bytes.Equal(got, data[off:off+size]) {
			t.Fatalf("read [%d,+%d): %v", off, size, err)
		}
	}
	read(0, 100)
	read(3<<20, 1<<20) // a fault's read-around: one fetch of what it covers
	mem := n.LazyCosts()[repo.UseMemory]
	if mem.Read == 0 || mem.ReadAhead != 0 || mem.Prefetched != 0 || mem.Fetched != mem.Read {
		t.Fatalf("two reads cost %+v: want the blocks read fetched, nothing more", mem)
	}
	if rootfs := n.LazyCosts()[repo.UseRootfs]; rootfs != (LazyCost{}) {
		t.Fatalf("memory reads counted under rootfs: %+v", rootfs)
	}
	read(4<<20, 4096) // continues the last fetch: still what was read
	mem = n.LazyCosts()[repo.UseMemory]
	if mem.ReadAhead != 0 || mem.Fetched != mem.Read {
		t.Fatalf("a sequential read of memory cost %+v: want the blocks read fetched, nothing more", mem)
	}
	r, err := blob.Open(ctx, n.LazyURL(l2, repo.UseRootfs), blob.HTTPOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for off := int64(0); off < 2<<20; off += 128 << 10 {
		if _, err := r.ReadAt(make([]byte, 128<<10), off); err != nil {
			t.Fatal(err)
		}
	}
	rootfs := n.LazyCosts()[repo.UseRootfs]
	// (Blocks read ahead and then read count in both.)
	if rootfs.ReadAhead == 0 || rootfs.Fetched > rootfs.Read+rootfs.ReadAhead {
		t.Fatalf("a sequential read of a rootfs layer cost %+v: want fetched <= read + read ahead, some read ahead", rootfs)
	}
	if n.LazyFetched() != mem.Fetched+rootfs.Fetched {
		t.Fatalf("LazyFetched %d, the reads by use fetched %d and %d", n.LazyFetched(), mem.Fetched, rootfs.Fetched)
	}
	bad := strings.Replace(n.LazyURL(l, repo.UseMemory), "use=memory", "use=swap", 1)
	if bb, err := blob.Open(ctx, bad, blob.HTTPOptions{}); err == nil {
		_, err = bb.ReadAt(make([]byte, 10), 0)
		bb.Close()
		if err == nil {
			t.Fatal("a read of a URL naming an unknown use worked")
		}
	}
}

// s3Node opens a repository node on bucket with a data directory of its
// own (returned), closed when the test ends.
func s3Node(t *testing.T, bucket s3.Config) (*Node, string) {
	t.Helper()
	c := config.Default()
	c.DataDir = t.TempDir()
	c.Repository.Backend, c.Repository.Endpoint, c.Repository.Bucket = "s3", bucket.Endpoint, bucket.Bucket
	c.Repository.AccessKey, c.Repository.SecretKey, c.Repository.PathStyle = bucket.AccessKey, bucket.SecretKey, true
	n, err := Open(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n, c.DataDir
}

// FuzzOneRange: the layer socket's Range parser accepts one range inside
// the layer, at most maxLazyRange long, and never panics.
func FuzzOneRange(f *testing.F) {
	for _, s := range []string{"bytes=0-0", "bytes=5-", "bytes=1-2,3-4", "bytes=-5", "bytes=9-3", "bytes=0-99999999999"} {
		f.Add(s, int64(1000))
	}
	f.Fuzz(func(t *testing.T, h string, size int64) {
		if size <= 0 {
			return
		}
		off, n, err := oneRange(h, size)
		if err == nil && (off < 0 || n <= 0 || off+n > size || n > maxLazyRange) {
			t.Fatalf("oneRange(%q, %d) = %d, %d", h, size, off, n)
		}
	})
}

// FuzzLayerOfRequest: the layer socket's URL parser accepts only a layer
// with valid digests, sizes in range and a known use, and never panics.
func FuzzLayerOfRequest(f *testing.F) {
	hex := strings.Repeat("ab", 32)
	f.Add(lazyPath + hex + "?size=10&chunks=sha256:" + hex + "&chunks_size=40&use=memory")
	f.Add(lazyPath + hex + "?size=10&chunks=sha256:" + hex + "&chunks_size=40")
	f.Add(lazyPath + hex + "?size=-1&chunks=sha256:" + hex + "&chunks_size=40&use=swap")
	f.Add("/v1/other")
	f.Fuzz(func(t *testing.T, uri string) {
		u, err := url.ParseRequestURI(uri)
		if err != nil {
			return
		}
		l, use, err := layerOfRequest(u)
		if err != nil {
			return
		}
		if use != repo.UseRootfs && use != repo.UseMemory {
			t.Fatalf("accepted use %q", use)
		}
		if l.Size < 0 || l.Chunks.Size <= 0 || l.Chunks.Size > blob.MaxChunkTableSize ||
			l.Digest.Validate() != nil || l.Chunks.Digest.Validate() != nil {
			t.Fatalf("accepted a bad layer %+v", l)
		}
	})
}
