package s3_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/snapshot/repo/repotest"
	"github.com/agentenv/agentenv/snapshot/repo/s3"
	"github.com/agentenv/agentenv/snapshot/repo/s3/s3test"
	"github.com/agentenv/agentenv/storage/blob"
)

const chunk = 64 << 10

// TestVerifiedLayerCorruption stores a layer in a real S3 server, then
// damages the object behind the server's back: a flipped byte, a truncated
// object and a replaced (stale) object each fail the read of the affected
// chunk loudly, naming the layer digest and the chunk, and serve nothing;
// chunks the damage does not touch still read.
func TestVerifiedLayerCorruption(t *testing.T) {
	srv := s3test.Start(t)
	cfg := srv.Bucket(t)
	cfg.Prefix = "p"
	ctx := context.Background()
	r, err := s3.Open(ctx, cfg, repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	data := repotest.Random(42, 5*chunk+1234)
	path := filepath.Join(t.TempDir(), "rootfs.lsmt")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := repo.PutLayerFile(ctx, r, path, chunk)
	if err != nil {
		t.Fatal(err)
	}
	if l.Digest != repo.DigestOf(data) {
		t.Fatalf("layer digest %s, want the file's", l.Digest)
	}
	open := func() *blob.Cache {
		c, err := repo.OpenLayer(ctx, r, l, repo.LayerOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	got := make([]byte, len(data))
	if _, err := open().ReadAt(got, 0); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read of the intact layer: %v", err)
	}
	obj := srv.ObjectPath(cfg.Bucket, "p/"+repo.BlobKey(l.Digest))
	damage := func(name string, f func([]byte) []byte, badChunk int64) {
		t.Helper()
		if err := os.WriteFile(obj, f(bytes.Clone(data)), 0o600); err != nil {
			t.Fatal(err)
		}
		c := open()
		buf := bytes.Repeat([]byte{0x55}, chunk)
		n, err := c.ReadAt(buf, badChunk*chunk)
		want := fmt.Sprintf("chunk %d", badChunk)
		if n != 0 || !errors.Is(err, blob.ErrCorrupt) || !strings.Contains(err.Error(), string(l.Digest)) || !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: read of chunk %d gave %d bytes, %v", name, badChunk, n, err)
		}
		if !bytes.Equal(buf, make([]byte, chunk)) && !bytes.Equal(buf, bytes.Repeat([]byte{0x55}, chunk)) {
			t.Fatalf("%s: unverified bytes reached the caller", name)
		}
		if badChunk > 0 {
			if _, err := c.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, data[:chunk]) {
				t.Fatalf("%s: an undamaged chunk: %v", name, err)
			}
		}
	}
	if err := repo.CheckLayer(ctx, r, l); err != nil {
		t.Fatalf("check of the intact layer: %v", err)
	}
	damage("flipped byte", func(b []byte) []byte { b[3*chunk+100] ^= 1; return b }, 3)
	if err := repo.CheckLayer(ctx, r, l); !errors.Is(err, blob.ErrCorrupt) || !strings.Contains(err.Error(), "chunk 3") {
		t.Fatalf("check of a damaged layer: %v", err)
	}
	damage("truncated", func(b []byte) []byte { return b[:4*chunk+10] }, 4)
	damage("stale", func(b []byte) []byte { return repotest.Random(43, len(b)) }, 0)

	// A damaged chunk table: the layer does not open.
	tab := srv.ObjectPath(cfg.Bucket, "p/"+repo.BlobKey(l.Chunks.Digest))
	tb, _ := os.ReadFile(tab)
	tb[len(tb)-1] ^= 1
	os.WriteFile(tab, tb, 0o600)
	if _, err := repo.OpenLayer(ctx, r, l, repo.LayerOptions{}); !errors.Is(err, repo.ErrDigestMismatch) {
		t.Fatalf("open with a damaged chunk table: %v", err)
	}
}

// TestLargeBlob: a blob above the multipart threshold goes through staging,
// the digest check and the server-side copy, and reads back whole.
func TestLargeBlob(t *testing.T) {
	srv := s3test.Start(t)
	ctx := context.Background()
	r, err := s3.Open(ctx, srv.Bucket(t), repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	data := repotest.Random(77, 17<<20+5) // just past the 16 MiB part size
	d := repo.DigestOf(data)
	if err := r.PutBlob(ctx, repo.DigestOf(data[1:]), int64(len(data)), bytes.NewReader(data)); !errors.Is(err, repo.ErrDigestMismatch) {
		t.Fatalf("a large blob under a wrong digest: %v", err)
	}
	if err := r.PutBlob(ctx, d, int64(len(data)), bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	rc, err := r.ReadBlob(ctx, d, 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	got, err := io.ReadAll(rc)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("large blob read back: %d bytes, %v", len(got), err)
	}
	if objs, _ := r.Backend().List(ctx, "staging/"); len(objs) != 0 {
		t.Fatalf("staging objects left: %v", objs)
	}
}

// TestWrongContentRange: a proxy between the node and a real S3 server
// rewrites the Content-Range of ranged answers (one chunk off): the read
// fails naming the layer and the chunk, and serves nothing.
func TestWrongContentRange(t *testing.T) {
	srv := s3test.Start(t)
	cfg := srv.Bucket(t)
	ctx := context.Background()
	r, err := s3.Open(ctx, cfg, repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	data := repotest.Random(44, 4*chunk)
	path := filepath.Join(t.TempDir(), "layer")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := repo.PutLayerFile(ctx, r, path, chunk)
	if err != nil {
		t.Fatal(err)
	}
	target, _ := url.Parse(srv.Endpoint)
	proxy := httputil.NewSingleHostReverseProxy(target)
	proxy.ModifyResponse = func(resp *http.Response) error {
		var first, last, total int64
		if _, err := fmt.Sscanf(resp.Header.Get("Content-Range"), "bytes %d-%d/%d", &first, &last, &total); err == nil &&
			strings.Contains(resp.Request.URL.Path, "/blobs/") && total == int64(len(data)) {
			resp.Header.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", first+chunk, last+chunk, total))
		}
		return nil
	}
	front := httptest.NewServer(proxy)
	defer front.Close()
	cfg.Endpoint = front.URL
	via, err := s3.Open(ctx, cfg, repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := repo.OpenLayer(ctx, via, l, repo.LayerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, chunk)
	n, err := c.ReadAt(buf, chunk)
	if n != 0 || err == nil || !strings.Contains(err.Error(), "Content-Range") || !strings.Contains(err.Error(), string(l.Digest)) ||
		!strings.Contains(err.Error(), "chunks 1-") {
		t.Fatalf("read through a proxy that rewrites Content-Range: %d bytes, %v", n, err)
	}
}
