// Package peer owns the node-to-node sharing of layers: an HTTP handler that
// serves the blobs a node holds by digest (with range requests), and a
// client that reads a layer from the peers that hold it before the object
// store. Peers are not trusted any more than the store: every chunk they
// serve is checked against the layer's chunk table (storage/blob.Verified),
// and a peer whose bytes do not verify is passed over.
package peer

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/storage/blob"
)

// PathPrefix is where the handler serves blobs: PathPrefix + "<hex>".
const PathPrefix = "/v1/blobs/sha256/"

// Local is what a node holds, by digest.
type Local interface {
	// OpenBlob opens the node's copy of d; an error wrapping fs.ErrNotExist
	// when it holds none.
	OpenBlob(d repo.Digest) (io.ReadSeekCloser, error)
}

// Index is a Local of files registered by digest: the node adds a layer
// once it holds all of it (sealed here, or fetched whole) and removes it
// before deleting the file.
type Index struct {
	mu    sync.RWMutex
	files map[repo.Digest]string
}

// NewIndex returns an empty index.
func NewIndex() *Index { return &Index{files: map[repo.Digest]string{}} }

// Add advertises path as the node's copy of blob d.
func (x *Index) Add(d repo.Digest, path string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.files[d] = path
}

// Remove stops advertising d.
func (x *Index) Remove(d repo.Digest) {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.files, d)
}

// OpenBlob implements Local.
func (x *Index) OpenBlob(d repo.Digest) (io.ReadSeekCloser, error) {
	x.mu.RLock()
	p, ok := x.files[d]
	x.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("blob %s: %w", d, fs.ErrNotExist)
	}
	return os.Open(p)
}

// Handler serves the blobs of local. With a token, requests must carry
// "Authorization: Bearer <token>".
func Handler(local Local, token string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if !authorized(r, token) {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		hex, ok := strings.CutPrefix(r.URL.Path, PathPrefix)
		d := repo.Digest("sha256:" + hex)
		if !ok || d.Validate() != nil {
			http.Error(w, "not a blob path", http.StatusNotFound)
			return
		}
		f, err := local.OpenBlob(d)
		if errors.Is(err, fs.ErrNotExist) {
			http.Error(w, "blob not held here", http.StatusNotFound)
			return
		}
		if err != nil {
			http.Error(w, "open blob failed", http.StatusInternalServerError)
			return
		}
		defer f.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("ETag", `"`+string(d)+`"`)
		http.ServeContent(w, r, "", time.Time{}, f)
	})
}

func authorized(r *http.Request, token string) bool {
	if token == "" {
		return true
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return ok && subtle.ConstantTimeCompare([]byte(got), []byte(token)) == 1
}

// Client reads layers from peers.
type Client struct {
	// Peers are the base URLs of the other nodes' peer endpoints
	// ("http://10.0.0.2:3002"), tried in order.
	Peers []string
	// Token is sent as a Bearer token when not empty.
	Token string
	// HTTP is the client for peer requests; default: 30 s timeout.
	HTTP *http.Client
	// ProbeTimeout bounds asking every peer whether it holds a blob; peers
	// that do not answer in time are not used for it. Default 1 s.
	ProbeTimeout time.Duration

	mu         sync.Mutex
	discovered []string // SetDiscovered's, asked after Peers
}

// SetDiscovered replaces the peers found at run time (the cluster
// scheduler's list of nodes that are up); Peers, from the configuration,
// are asked first. Safe while reads run.
func (c *Client) SetDiscovered(peers []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.discovered = slices.Clone(peers)
}

// list is every peer to ask, in order, each once.
func (c *Client) list() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := slices.Clone(c.Peers)
	for _, p := range c.discovered {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

func (c *Client) httpClient() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return &http.Client{Timeout: 30 * time.Second}
}

func (c *Client) url(peer string, d repo.Digest) string {
	return strings.TrimRight(peer, "/") + PathPrefix + d.Hex()
}

// Sources asks every peer (at once) whether it holds b and opens those that
// do, configured peers first; ctx bounds every later read from them.
func (c *Client) Sources(ctx context.Context, b repo.Blob) []blob.Blob {
	pctx, cancel := context.WithTimeout(ctx, c.probeTimeout())
	defer cancel()
	peers := c.list()
	found := make([]bool, len(peers))
	var wg sync.WaitGroup
	for i, p := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			found[i] = c.holds(pctx, p, b)
		}()
	}
	wg.Wait()
	var out []blob.Blob
	hdr := http.Header{}
	if c.Token != "" {
		hdr.Set("Authorization", "Bearer "+c.Token)
	}
	for i, p := range peers {
		if !found[i] {
			continue
		}
		h, err := blob.OpenHTTP(ctx, c.url(p, b.Digest), blob.HTTPOptions{Client: c.httpClient(), Header: hdr, Retries: 1})
		if err != nil || h.Size() != b.Size {
			continue
		}
		out = append(out, &source{HTTP: h, c: c, peer: p})
	}
	return out
}

func (c *Client) probeTimeout() time.Duration {
	if c.ProbeTimeout > 0 {
		return c.ProbeTimeout
	}
	return time.Second
}

// holds asks peer for b with a HEAD request.
func (c *Client) holds(ctx context.Context, peer string, b repo.Blob) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, c.url(peer, b.Digest), nil)
	if err != nil {
		return false
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK && resp.ContentLength == b.Size
}

// source is one peer's copy of a layer; it can give the layer's chunk table
// too (repo.TableSource), for when the store is unreachable.
type source struct {
	*blob.HTTP
	c    *Client
	peer string
}

// ChunkTable fetches the table blob of l from the same peer.
func (s *source) ChunkTable(l repo.Layer) ([]byte, error) {
	if l.Chunks.Size > blob.MaxChunkTableSize {
		return nil, fmt.Errorf("chunk table %s: %d bytes: %w", l.Chunks.Digest, l.Chunks.Size, repo.ErrInvalid)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.c.url(s.peer, l.Chunks.Digest), nil)
	if err != nil {
		return nil, err
	}
	if s.c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+s.c.Token)
	}
	resp, err := s.c.httpClient().Do(req)
	if err != nil {
		return nil, fmt.Errorf("chunk table %s from %s: %w", l.Chunks.Digest, s.peer, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("chunk table %s from %s: status %s", l.Chunks.Digest, s.peer, resp.Status)
	}
	return io.ReadAll(io.LimitReader(resp.Body, l.Chunks.Size+1))
}

// OpenLayer opens l for lazy, verified reads from the peers that hold it,
// then from r.
func (c *Client) OpenLayer(ctx context.Context, r repo.Repository, l repo.Layer, cache blob.CacheOptions) (*blob.Cache, error) {
	return repo.OpenLayer(ctx, r, l, repo.LayerOptions{Before: c.Sources(ctx, l.Blob), Cache: cache})
}
