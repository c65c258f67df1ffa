package reponode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/storage/blob"
)

// The layer socket: how the node's storage daemon reads a rootfs layer the
// node has not fetched yet. A restore names each such layer by a http+unix
// URL (LazyURL) in the image config the daemon exports; the daemon reads it
// with range requests over a Unix socket only root can open, and this
// server answers them from the node's verified block cache (peers first,
// then the store; every chunk checked against the layer's chunk table, the
// cache's size limit shared with every remote layer opened here), or from
// the node's own copy once Fetch made one. A chunk that verifies from no
// source fails the read (422, naming the layer's digest in the log): the
// daemon passes the failure to the guest as an I/O error and no byte of it
// is ever served. The URL carries everything needed to read the layer (its
// digest, size and chunk table), so a restarted node serves the URLs its
// daemon's devices were made with.

// lazyPath is where the layer socket serves layers: lazyPath + "<hex>?size=
// N&chunks=sha256:<hex>&chunks_size=M&use=U" (use: repo.UseRootfs, the
// default, or repo.UseMemory; it only sorts the socket's counts).
const lazyPath = "/v1/lazy/sha256/"

// maxLazyRange bounds one read the layer socket answers (the daemon asks
// for a few chunks at a time).
const maxLazyRange = 64 << 20

// maxLazyLayers bounds the layers the socket keeps open at once.
const maxLazyLayers = 1024

// lazyServer is the layer socket's state.
type lazyServer struct {
	socket string
	lis    net.Listener
	srv    *http.Server
	ctx    context.Context // bounds every remote read

	mu     sync.Mutex
	open   map[repo.Digest]*lazyLayer
	closed map[string]LazyCost // what layers no longer open cost, by use
	// failed holds the last failed read of each layer (LazyFailure), at
	// most maxFailures of them: whoever asks why a VM ended asks soon after.
	failed map[repo.Digest]lazyFailure

	lastError atomic.Int64 // unix ns of the last logged read failure

	hints hintJobs // working-set prefetches of opened layers (lazyhints.go)
}

// lazyFailure is a failed read of a layer and when it failed.
type lazyFailure struct {
	err error
	at  time.Time
}

// recentFailure is how old a failed read LazyFailure still reports: a VMM
// faulting on a read that failed ends at once, so an older one is not why.
const recentFailure = time.Minute

// lazyLayer is one layer opened for lazy reads (once: concurrent first
// reads wait for the same open).
type lazyLayer struct {
	layer repo.Layer
	use   string // of the read that opened it
	ready chan struct{}
	c     *blob.Cache
	err   error
	// unhinted: the repository held no working set of the layer when it
	// was opened; the blocks read until it is local become one.
	unhinted atomic.Bool
	// stopHint ends the prefetch of the layer's hint and waits for it;
	// hinted is closed when the prefetch ended (done, failed, stopped or
	// none). Both set before ready closes.
	stopHint func()
	hinted   <-chan struct{}
}

// ServeLayers starts the layer socket at socket (a path under the data
// directory: it must stay the same across restarts, since device records
// name it). Close stops it.
func (n *Node) ServeLayers(ctx context.Context, socket string) error {
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("snapshot repository: layer socket %s: %w", socket, err)
	}
	lis, err := net.Listen("unix", socket)
	if err != nil {
		return fmt.Errorf("snapshot repository: layer socket: %w", err)
	}
	// Whoever connects reads every layer of the repository: root only.
	if err := os.Chmod(socket, 0o600); err != nil {
		lis.Close()
		return fmt.Errorf("snapshot repository: layer socket %s: %w", socket, err)
	}
	ls := &lazyServer{socket: socket, lis: lis, ctx: context.WithoutCancel(ctx), open: map[repo.Digest]*lazyLayer{},
		closed: map[string]LazyCost{}}
	ls.hints.ctx, ls.hints.stop = context.WithCancel(ls.ctx)
	ls.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { n.serveLazy(w, r) }),
		ReadHeaderTimeout: 10 * time.Second}
	n.mu.Lock()
	n.lazy = ls
	n.mu.Unlock()
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		if err := ls.srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			slog.Error("snapshot repository: layer socket stopped", "socket", socket, "err", err)
		}
	}()
	slog.Info("snapshot repository: serving lazy layers to the storage daemon", "socket", socket)
	return nil
}

// close stops the layer socket and closes the layers it opened.
func (ls *lazyServer) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	err := ls.srv.Shutdown(ctx)
	cancel()
	ls.hints.stop()
	ls.hints.wg.Wait()
	ls.mu.Lock()
	open := ls.open
	ls.open = map[repo.Digest]*lazyLayer{}
	ls.mu.Unlock()
	for _, l := range open {
		<-l.ready
		if l.c != nil {
			l.c.Close()
		}
	}
	return err
}

// LazyURL names layer l, read for use (repo.UseRootfs or UseMemory), for
// lazy reads through the layer socket ("" when the node serves none: the
// caller fetches the layer whole instead).
func (n *Node) LazyURL(l repo.Layer, use string) string {
	n.mu.Lock()
	ls := n.lazy
	n.mu.Unlock()
	if ls == nil {
		return ""
	}
	q := url.Values{}
	q.Set("size", strconv.FormatInt(l.Size, 10))
	q.Set("chunks", string(l.Chunks.Digest))
	q.Set("chunks_size", strconv.FormatInt(l.Chunks.Size, 10))
	q.Set("use", use)
	return blob.UnixURL(ls.socket, lazyPath+l.Digest.Hex()+"?"+q.Encode())
}

// LazyFailure is the last failed read through the layer socket of the
// layer ref (a LazyURL) names: nil when none failed in the last
// recentFailure, or ref names no layer. A VM that mapped memory from such
// a layer and ended says so.
func (n *Node) LazyFailure(ref string) error {
	l, ok := LazyLayer(ref)
	ls := n.lazyState()
	if !ok || ls == nil {
		return nil
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if f, ok := ls.failed[l.Digest]; ok && time.Since(f.at) < recentFailure {
		return f.err
	}
	return nil
}

// LazyLayer is the layer a LazyURL names (of any node's socket: the URL
// holds the whole description).
func (n *Node) LazyLayer(ref string) (repo.Layer, bool) { return LazyLayer(ref) }

// LazyLayer is the layer a LazyURL names.
func LazyLayer(ref string) (repo.Layer, bool) {
	_, uri, err := blob.ParseUnixURL(ref)
	if err != nil {
		return repo.Layer{}, false
	}
	u, err := url.ParseRequestURI(uri)
	if err != nil {
		return repo.Layer{}, false
	}
	l, _, err := layerOfRequest(u)
	return l, err == nil
}

// layerOfRequest reads and checks the layer a request to the socket names
// and what it is read for.
func layerOfRequest(u *url.URL) (repo.Layer, string, error) {
	hex, ok := strings.CutPrefix(u.Path, lazyPath)
	if !ok {
		return repo.Layer{}, "", errors.New("not a layer path")
	}
	q := u.Query()
	use := q.Get("use")
	switch use {
	case "": // a URL made before uses were named: devices' lowers were rootfs then
		use = repo.UseRootfs
	case repo.UseRootfs, repo.UseMemory:
	default:
		return repo.Layer{}, "", fmt.Errorf("unknown use %.20q", use)
	}
	size, err1 := strconv.ParseInt(q.Get("size"), 10, 64)
	csize, err2 := strconv.ParseInt(q.Get("chunks_size"), 10, 64)
	l := repo.Layer{Blob: repo.Blob{Digest: repo.Digest("sha256:" + hex), Size: size},
		Chunks: repo.Blob{Digest: repo.Digest(q.Get("chunks")), Size: csize}}
	switch {
	case err1 != nil || err2 != nil || size < 0 || csize <= 0 || csize > blob.MaxChunkTableSize:
		return repo.Layer{}, "", errors.New("bad size or chunk table size")
	case l.Digest.Validate() != nil || l.Chunks.Digest.Validate() != nil:
		return repo.Layer{}, "", errors.New("bad digest")
	}
	return l, use, nil
}

// serveLazy answers one read of a layer: HEAD (its size), or GET of one
// byte range.
func (n *Node) serveLazy(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	l, use, err := layerOfRequest(r.URL)
	if err != nil {
		http.Error(w, err.Error(), http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Accept-Ranges", "bytes")
	if r.Method == http.MethodHead {
		w.Header().Set("Content-Length", strconv.FormatInt(l.Size, 10))
		return
	}
	off, length, err := oneRange(r.Header.Get("Range"), l.Size)
	if err != nil {
		w.Header().Set("Content-Range", fmt.Sprintf("bytes */%d", l.Size))
		http.Error(w, err.Error(), http.StatusRequestedRangeNotSatisfiable)
		return
	}
	buf := make([]byte, length)
	if err := n.readLazy(l, use, buf, off); err != nil {
		http.Error(w, err.Error(), lazyStatus(err))
		return
	}
	w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", off, off+length-1, l.Size))
	w.Header().Set("Content-Length", strconv.FormatInt(length, 10))
	w.WriteHeader(http.StatusPartialContent)
	_, _ = w.Write(buf)
}

// oneRange parses a Range header of one range "bytes=a-b" or "bytes=a-"
// within a blob of size bytes.
func oneRange(h string, size int64) (off, length int64, err error) {
	spec, ok := strings.CutPrefix(h, "bytes=")
	a, b, ok2 := strings.Cut(spec, "-")
	if !ok || !ok2 || strings.Contains(spec, ",") {
		return 0, 0, fmt.Errorf("want one range bytes=a-b, got %q", h)
	}
	first, err := strconv.ParseInt(a, 10, 64)
	if err != nil || first < 0 || first >= size {
		return 0, 0, fmt.Errorf("range %q outside the layer's %d bytes", h, size)
	}
	last := size - 1
	if b != "" {
		if last, err = strconv.ParseInt(b, 10, 64); err != nil || last < first {
			return 0, 0, fmt.Errorf("bad range %q", h)
		}
		last = min(last, size-1)
	}
	if last-first+1 > maxLazyRange {
		return 0, 0, fmt.Errorf("range %q is more than %d bytes", h, maxLazyRange)
	}
	return first, last - first + 1, nil
}

// lazyStatus is the answer to a failed read: 422 when no source gave bytes
// that verify (the daemon does not retry it: the guest gets its I/O error
// at once), 503 otherwise (the store or a peer did not answer: retried).
func lazyStatus(err error) int {
	if errors.Is(err, blob.ErrCorrupt) || errors.Is(err, repo.ErrDigestMismatch) || errors.Is(err, repo.ErrInvalid) ||
		errors.Is(err, repo.ErrNotFound) {
		return http.StatusUnprocessableEntity
	}
	return http.StatusServiceUnavailable
}

// readLazy fills p with layer l's bytes at off, read for use: from the
// node's own copy when it holds one, else through the layer's verified
// cache.
func (n *Node) readLazy(l repo.Layer, use string, p []byte, off int64) error {
	if f, err := n.Held.OpenBlob(l.Digest); err == nil {
		defer f.Close()
		if ra, ok := f.(io.ReaderAt); ok {
			if _, err := ra.ReadAt(p, off); err == nil || (errors.Is(err, io.EOF) && off+int64(len(p)) == l.Size) {
				return nil
			}
		}
	}
	c, err := n.openLazy(l, use)
	if err == nil {
		_, err = c.ReadAt(p, off)
		if errors.Is(err, io.EOF) && off+int64(len(p)) == l.Size {
			err = nil
		}
	}
	if err != nil {
		clear(p)
		n.logLazyError(l, off, len(p), err)
		return fmt.Errorf("read layer %s [%d,+%d): %w", l.Digest, off, len(p), err)
	}
	return nil
}

// maxFailures bounds the failed reads a layer socket remembers.
const maxFailures = 256

// logLazyError logs a failed read with the layer's digest, at most once a
// second, and remembers it for LazyFailure.
func (n *Node) logLazyError(l repo.Layer, off int64, length int, err error) {
	ls := n.lazyState()
	if ls == nil {
		return
	}
	ls.mu.Lock()
	if ls.failed == nil || len(ls.failed) >= maxFailures {
		ls.failed = map[repo.Digest]lazyFailure{}
	}
	ls.failed[l.Digest] = lazyFailure{err: fmt.Errorf("read of layer %s [%d,+%d) failed: %w", l.Digest, off, length, err), at: time.Now()}
	ls.mu.Unlock()
	now, last := time.Now().UnixNano(), ls.lastError.Load()
	if now-last >= int64(time.Second) && ls.lastError.CompareAndSwap(last, now) {
		slog.Error("snapshot repository: lazy read of a layer failed; the guest gets an I/O error", "layer", l.Digest,
			"offset", off, "length", length, "corrupt", lazyStatus(err) == http.StatusUnprocessableEntity, "err", err)
	}
}

func (n *Node) lazyState() *lazyServer {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.lazy
}

// openLazy returns l opened for verified reads, opening it on first use
// (counted under use).
func (n *Node) openLazy(l repo.Layer, use string) (*blob.Cache, error) {
	ls := n.lazyState()
	if ls == nil {
		return nil, errors.New("the layer socket is closed")
	}
	ls.mu.Lock()
	ll, ok := ls.open[l.Digest]
	if !ok {
		if len(ls.open) >= maxLazyLayers {
			ls.mu.Unlock()
			return nil, fmt.Errorf("%d layers are open for lazy reads already", maxLazyLayers)
		}
		ll = &lazyLayer{layer: l, use: use, ready: make(chan struct{})}
		ls.open[l.Digest] = ll
	}
	ls.mu.Unlock()
	if !ok {
		ll.c, ll.err = n.Peers.OpenLayer(ls.ctx, n.Repo, l, lazyCacheOptions(n.cacheOptions(true), use))
		if ll.err == nil {
			n.prefetchHint(ls, ll)
		}
		close(ll.ready)
		if ll.err != nil {
			ls.mu.Lock()
			if ls.open[l.Digest] == ll {
				delete(ls.open, l.Digest) // the next read tries again
			}
			ls.mu.Unlock()
		}
	}
	<-ll.ready
	if ll.err == nil && ll.c.Size() != l.Size {
		return nil, fmt.Errorf("layer %s is %d bytes, the URL says %d: %w", l.Digest, ll.c.Size(), l.Size, repo.ErrInvalid)
	}
	return ll.c, ll.err
}

// lazyCacheOptions are those of a layer read for use: a memory layer's
// cache reads nothing ahead, since the memory export's mount reads around
// every fault already (a second read-ahead on top fetched a 2 MiB window
// per fault in a row, most of it never read).
func lazyCacheOptions(o blob.CacheOptions, use string) blob.CacheOptions {
	if use == repo.UseMemory {
		o.ReadAhead = 1
	}
	return o
}

// dropLazy closes layer d's lazy cache once the node holds the layer (its
// reads come from the file from then on).
func (n *Node) dropLazy(d repo.Digest) {
	ls := n.lazyState()
	if ls == nil {
		return
	}
	ls.mu.Lock()
	ll, ok := ls.open[d]
	if ok {
		delete(ls.open, d)
	}
	ls.mu.Unlock()
	if !ok {
		return
	}
	<-ll.ready
	if ll.c != nil {
		ll.stopHint()
		cost := costOf(ll.c)
		hits, misses, fetches := ll.c.Stats()
		slog.Info("snapshot repository: layer is local now; its lazy reads are done", "layer", d, "use", ll.use,
			"fetched_bytes", cost.Fetched, "read_bytes", cost.Read, "readahead_bytes", cost.ReadAhead,
			"prefetched_bytes", cost.Prefetched, "fetches", fetches, "block_hits", hits, "block_misses", misses)
		n.recordHint(ls, ll)
		ll.c.Close()
		ls.mu.Lock()
		ls.closed[ll.use] = ls.closed[ll.use].plus(cost)
		ls.mu.Unlock()
	}
}
