package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/storage/zfile"
	"github.com/google/go-containerregistry/pkg/registry"
)

// pushBlob uploads b to a registry with the distribution API (POST, then PUT
// with the digest) and returns the blob URL.
func pushBlob(t *testing.T, base, repo string, b []byte) string {
	t.Helper()
	sum := sha256.Sum256(b)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	resp, err := http.Post(base+"/v2/"+repo+"/blobs/uploads/", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	loc := resp.Header.Get("Location")
	if resp.StatusCode != http.StatusAccepted || loc == "" {
		t.Fatalf("start upload: %s", resp.Status)
	}
	if !strings.HasPrefix(loc, "http") {
		loc = base + loc
	}
	sep := "?"
	if strings.Contains(loc, "?") {
		sep = "&"
	}
	req, _ := http.NewRequest(http.MethodPut, loc+sep+"digest="+digest, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("finish upload: %s", resp.Status)
	}
	return base + "/v2/" + repo + "/blobs/" + digest
}

// TestRegistryBlobLower stores a ZFile layer in a real OCI registry
// (go-containerregistry's server, on the loopback) and reads the image
// straight from the blob URL with range requests.
func TestRegistryBlobLower(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	raw := fill(21, 3<<20)
	clear(raw[1<<20 : 2<<20])
	os.WriteFile(filepath.Join(dir, "disk.raw"), raw, 0o644)
	layer := filepath.Join(dir, "base.zfile")
	if _, err := ImportRaw(ctx, filepath.Join(dir, "disk.raw"), layer, CommitOptions{Compress: &zfile.Options{}}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	blobBytes, _ := os.ReadFile(layer)
	url := pushBlob(t, srv.URL, "agentenv/base", blobBytes)

	cfg := filepath.Join(dir, "img.json")
	if _, err := Create(ctx, cfg, CreateSpec{Lowers: []string{url}}); err != nil {
		t.Fatal(err)
	}
	im, err := Open(ctx, cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	if got := readAll(t, im); !bytes.Equal(got, raw) {
		t.Fatal("image on a registry blob differs from the imported disk")
	}
}
