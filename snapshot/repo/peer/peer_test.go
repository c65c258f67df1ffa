package peer

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/snapshot/repo/posix"
	"github.com/agentenv/agentenv/snapshot/repo/repotest"
	"github.com/agentenv/agentenv/storage/blob"
)

const chunk = 16 << 10

type fixture struct {
	r     *repo.Repo
	layer repo.Layer
	data  []byte
	path  string
}

func newFixture(t *testing.T) *fixture {
	r, err := posix.Open(t.TempDir(), repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	data := repotest.Random(7, 10*chunk+99)
	path := filepath.Join(t.TempDir(), "rootfs.lsmt")
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := repo.PutLayerFile(context.Background(), r, path, chunk)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{r: r, layer: l, data: data, path: path}
}

// node starts a peer endpoint on the loopback serving idx.
func node(t *testing.T, idx *Index, token string) string {
	srv := httptest.NewServer(Handler(idx, token))
	t.Cleanup(srv.Close)
	return srv.URL
}

func readAll(t *testing.T, c *blob.Cache, want []byte) {
	t.Helper()
	got := make([]byte, len(want))
	if _, err := c.ReadAt(got, 0); err != nil && err != io.EOF {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the layer read differs from the original")
	}
}

// TestPeerFirst: a layer a peer holds is read from the peer, not the store;
// peers that lack it, are down, or refuse the token are passed over.
func TestPeerFirst(t *testing.T) {
	f := newFixture(t)
	holder := NewIndex()
	holder.Add(f.layer.Digest, f.path)
	empty := node(t, NewIndex(), "")
	down := httptest.NewServer(http.NotFoundHandler())
	down.Close()
	locked := node(t, holder, "other-secret")
	good := node(t, holder, "s3cret")
	c := &Client{Peers: []string{down.URL, empty, locked, good}, Token: "s3cret"}
	ctx := context.Background()
	srcs := c.Sources(ctx, f.layer.Blob)
	if len(srcs) != 1 || srcs[0].Name() != good+PathPrefix+f.layer.Digest.Hex() {
		t.Fatalf("sources %v, want only the peer that holds the layer and takes the token", names(srcs))
	}
	lc, err := c.OpenLayer(ctx, f.r, f.layer, blob.CacheOptions{})
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, lc, f.data)
	fetched, _ := lc.Source().(*blob.Verified).Fetched()
	if fetched[0] != int64(len(f.data)) || fetched[1] != 0 {
		t.Fatalf("bytes from peer, store = %v; want all from the peer", fetched)
	}
}

func names(bs []blob.Blob) []string {
	var out []string
	for _, b := range bs {
		out = append(out, b.Name())
	}
	return out
}

// TestBadPeerFallsBack: a peer serving a damaged copy is passed over chunk
// by chunk for the store, and the reader gets the right bytes.
func TestBadPeerFallsBack(t *testing.T) {
	f := newFixture(t)
	bad := bytes.Clone(f.data)
	bad[4*chunk+5] ^= 0x80
	badPath := filepath.Join(t.TempDir(), "damaged")
	if err := os.WriteFile(badPath, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	idx := NewIndex()
	idx.Add(f.layer.Digest, badPath)
	c := &Client{Peers: []string{node(t, idx, "")}}
	lc, err := c.OpenLayer(context.Background(), f.r, f.layer, blob.CacheOptions{ReadAhead: 1})
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, lc, f.data)
	fetched, rejected := lc.Source().(*blob.Verified).Fetched()
	if rejected[0] != 1 || fetched[1] != chunk || fetched[0] != int64(len(f.data))-chunk {
		t.Fatalf("fetched %v rejected %v: want one chunk from the store after the peer's was rejected", fetched, rejected)
	}
}

// TestStoreDownPeerServesTable: with the store unreachable, the layer and its
// chunk table come from a peer.
func TestStoreDownPeerServesTable(t *testing.T) {
	f := newFixture(t)
	idx := NewIndex()
	idx.Add(f.layer.Digest, f.path)
	tab, err := repo.ReadSmallBlob(context.Background(), f.r, f.layer.Chunks, blob.MaxChunkTableSize)
	if err != nil {
		t.Fatal(err)
	}
	tabPath := filepath.Join(t.TempDir(), "table")
	os.WriteFile(tabPath, tab, 0o600)
	idx.Add(f.layer.Chunks.Digest, tabPath)
	gone, err := posix.Open(t.TempDir(), repo.Options{}) // a store without the layer
	if err != nil {
		t.Fatal(err)
	}
	c := &Client{Peers: []string{node(t, idx, "")}}
	lc, err := c.OpenLayer(context.Background(), gone, f.layer, blob.CacheOptions{})
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, lc, f.data)
}

// TestHandler: range requests, HEAD, bad paths and methods.
func TestHandler(t *testing.T) {
	f := newFixture(t)
	idx := NewIndex()
	idx.Add(f.layer.Digest, f.path)
	base := node(t, idx, "")
	url := base + PathPrefix + f.layer.Digest.Hex()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Range", "bytes=100-199")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	wantCR := fmt.Sprintf("bytes 100-199/%d", len(f.data))
	if resp.StatusCode != http.StatusPartialContent || resp.Header.Get("Content-Range") != wantCR || !bytes.Equal(body, f.data[100:200]) {
		t.Fatalf("range request: %s %q", resp.Status, resp.Header.Get("Content-Range"))
	}
	for path, want := range map[string]int{
		PathPrefix + "../../etc/passwd":       http.StatusNotFound,
		PathPrefix + repo.DigestOf(nil).Hex(): http.StatusNotFound,
		"/other":                              http.StatusNotFound,
	} {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s: %s, want %d", path, resp.Status, want)
		}
	}
	resp, err = http.Post(url, "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST: %s", resp.Status)
	}
	idx.Remove(f.layer.Digest)
	if resp, _ := http.Head(url); resp.StatusCode != http.StatusNotFound {
		t.Fatalf("HEAD after Remove: %s", resp.Status)
	}
}

// TestDiscoveredPeers: peers set at run time are asked after the configured
// ones, each once, and a newer list replaces the older.
func TestDiscoveredPeers(t *testing.T) {
	f := newFixture(t)
	holder := NewIndex()
	holder.Add(f.layer.Digest, f.path)
	configured, found := node(t, holder, ""), node(t, holder, "")
	c := &Client{Peers: []string{configured}}
	ctx := context.Background()
	c.SetDiscovered([]string{found, configured})
	if got := names(c.Sources(ctx, f.layer.Blob)); len(got) != 2 || !strings.HasPrefix(got[0], configured) || !strings.HasPrefix(got[1], found) {
		t.Fatalf("sources %v, want the configured peer, then the discovered one, each once", got)
	}
	c.SetDiscovered(nil)
	if got := names(c.Sources(ctx, f.layer.Blob)); len(got) != 1 || !strings.HasPrefix(got[0], configured) {
		t.Fatalf("sources %v after the discovered peers went, want the configured one alone", got)
	}
}
