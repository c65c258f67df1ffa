// Package reponode assembles what one node uses of the snapshot repository
// from aenvd's configuration ([repository]): the repository itself (POSIX or
// S3), the background uploader with its queue under the data directory, the
// peer endpoint serving the layers this node holds, and the client that
// reads remote layers from peers before the store. It is the one entry point
// the node server wires in.
package reponode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentenv/agentenv/config"
	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/snapshot/repo/peer"
	"github.com/agentenv/agentenv/snapshot/repo/posix"
	"github.com/agentenv/agentenv/snapshot/repo/s3"
	"github.com/agentenv/agentenv/snapshot/repo/upload"
	"github.com/agentenv/agentenv/storage/blob"
	"github.com/agentenv/agentenv/vmm/memsnap"
)

// Node is the repository side of one node.
type Node struct {
	Repo    *repo.Repo
	Uploads *upload.Uploader
	Peers   *peer.Client
	// Held is what this node serves to peers: add a layer (by digest) once
	// this node holds all of it, remove it before deleting the file.
	Held *peer.Index

	cfg      config.Repository
	budget   *blob.Budget // the block cache of every remote layer opened here
	lis      net.Listener
	srv      *http.Server
	wg       sync.WaitGroup
	closed   bool
	mu       sync.Mutex
	stop     context.CancelFunc // ends the periodic collection (gc.go)
	gcRuns   atomic.Int64
	lazy     *lazyServer                   // the layer socket, once ServeLayers ran (lazy.go)
	fetching map[repo.Digest]chan struct{} // Fetch calls in progress, by layer (fetchTurn)
	whole    atomic.Int64                  // bytes Fetch read from peers and the store
	packs    atomic.Int64                  // bytes of working-set packs ReadPack read
}

// Open opens the configured repository (nil, nil for backend "none"). A
// store that rejects the credentials or lacks the bucket is an error here.
func Open(ctx context.Context, c config.Config) (*Node, error) {
	rc := c.Repository
	opt := repo.Options{LeaseTTL: rc.LeaseTTL.Duration}
	var r *repo.Repo
	var err error
	switch rc.Backend {
	case "none":
		return nil, nil
	case "posix":
		r, err = posix.Open(c.RepositoryDir(), opt)
	case "s3":
		r, err = s3.Open(ctx, s3.Config{Endpoint: rc.Endpoint, Bucket: rc.Bucket, Prefix: rc.Prefix, Region: rc.Region,
			AccessKey: rc.AccessKey, SecretKey: rc.SecretKey, PathStyle: rc.PathStyle}, opt)
	default:
		err = fmt.Errorf("unknown backend %q", rc.Backend)
	}
	if err != nil {
		return nil, fmt.Errorf("open snapshot repository: %w", err)
	}
	u, err := upload.New(r, upload.Options{Dir: filepath.Join(c.DataDir, "uploads"), Concurrency: rc.UploadConcurrency,
		ChunkSize: int64(rc.ChunkSizeKiB) << 10, PackWorkingSet: memsnap.WritePack})
	if err != nil {
		return nil, fmt.Errorf("open snapshot repository: %w", err)
	}
	return &Node{Repo: r, Uploads: u, Held: peer.NewIndex(), cfg: rc, budget: blob.NewBudget(int64(rc.CacheMiB) << 20),
		Peers: &peer.Client{Peers: rc.Peers, Token: rc.PeerToken}}, nil
}

// Start starts the uploader and what Serve starts.
func (n *Node) Start(ctx context.Context) error {
	if err := n.Serve(ctx); err != nil {
		return err
	}
	n.Uploads.Start(ctx)
	return nil
}

// Serve starts, when configured, the peer endpoint and the periodic GC, but
// not the uploader (Uploads.Start): a node that must first learn which of
// its sandboxes are its own starts it later.
func (n *Node) Serve(ctx context.Context) error {
	if n.cfg.PeerListen != "" {
		lis, err := net.Listen("tcp", n.cfg.PeerListen)
		if err != nil {
			return fmt.Errorf("snapshot repository: peer endpoint: %w", err)
		}
		n.lis = lis
		n.srv = &http.Server{Handler: peer.Handler(n.Held, n.cfg.PeerToken), ReadHeaderTimeout: 10 * time.Second}
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			if err := n.srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				slog.Error("snapshot repository: peer endpoint stopped", "addr", lis.Addr(), "err", err)
			}
		}()
	}
	gcCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	n.stop = stop
	if every := n.cfg.GCInterval.Duration; every > 0 {
		n.wg.Add(1)
		go n.collect(gcCtx, every)
	}
	slog.Info("snapshot repository open", "store", n.Repo.String(), "peers", len(n.cfg.Peers), "peer_listen", n.PeerAddr(),
		"gc_interval", n.cfg.GCInterval.Duration, "gc_grace", n.cfg.GCGrace.Duration)
	return nil
}

// PeerAddr is the address the peer endpoint listens on ("" when off).
func (n *Node) PeerAddr() string {
	if n.lis == nil {
		return ""
	}
	return n.lis.Addr().String()
}

// Close stops the peer endpoint and the uploader and waits for both.
func (n *Node) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	n.mu.Unlock()
	var err error
	if n.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = n.srv.Shutdown(ctx)
		cancel()
	}
	if ls := n.lazyState(); ls != nil {
		err = errors.Join(err, ls.close())
	}
	if n.stop != nil {
		n.stop()
	}
	n.wg.Wait()
	return errors.Join(err, n.Uploads.Close())
}

// Commit queues a local snapshot or template for upload (durable once it
// returns); Status says how far it got.
func (n *Node) Commit(ctx context.Context, j upload.Job) error { return n.Uploads.Enqueue(ctx, j) }

// Manifests lists the repository's manifests.
func (n *Node) Manifests(ctx context.Context) ([]string, error) { return n.Repo.Manifests(ctx) }

// Manifest reads and validates a manifest.
func (n *Node) Manifest(ctx context.Context, name string) (*repo.Manifest, error) {
	return n.Repo.Manifest(ctx, name)
}

// ReadSmall reads a whole blob of at most limit bytes, verified.
func (n *Node) ReadSmall(ctx context.Context, b repo.Blob, limit int64) ([]byte, error) {
	return repo.ReadSmallBlob(ctx, n.Repo, b, limit)
}

// packReads is how many ranges of a working-set pack are read at once.
const packReads = 4

// ReadPack reads a memory working-set pack a manifest commits (at most
// memsnap.MaxPackBytes), verified, counting its bytes (PacksFetched).
func (n *Node) ReadPack(ctx context.Context, b repo.Blob) ([]byte, error) {
	data, err := repo.ReadBlobParallel(ctx, n.Repo, b, memsnap.MaxPackBytes, packReads)
	n.packs.Add(int64(len(data)))
	return data, err
}

// PacksFetched is the bytes of working-set packs read (ReadPack).
func (n *Node) PacksFetched() int64 { return n.packs.Load() }

// Forget drops an upload's record from the queue (a job that ended, or one
// whose files are gone).
func (n *Node) Forget(name string) error { return n.Uploads.Forget(name) }

// Cancel drops a queued upload (upload.Uploader.Cancel).
func (n *Node) Cancel(name string) error { return n.Uploads.Cancel(name) }

// Queued lists the upload queue.
func (n *Node) Queued() []upload.Status { return n.Uploads.List() }

// Status is the upload status of a manifest name.
func (n *Node) Status(name string) (upload.Status, bool) { return n.Uploads.Status(name) }

// OpenLayer opens a layer of a manifest for lazy, verified reads: from the
// peers that hold it, then the store, through a block cache whose size limit
// (cache_mib) all the layers opened here share. Close it when done.
func (n *Node) OpenLayer(ctx context.Context, l repo.Layer) (*blob.Cache, error) {
	return n.Peers.OpenLayer(ctx, n.Repo, l, n.cacheOptions(false))
}

func (n *Node) cacheOptions(record bool) blob.CacheOptions {
	// The block size is the layer's chunk size (from its table).
	return blob.CacheOptions{Capacity: int64(n.cfg.CacheMiB) << 20, Budget: n.budget, Record: record}
}

// CacheUsed is the bytes the block cache of remote layers holds now.
func (n *Node) CacheUsed() int64 { return n.budget.Used() }

// Fetch keeps layer l local: it is copied whole (peers first, verified)
// into dir/<hex> unless that file exists, and then served to peers. A
// layer the node holds already elsewhere (a template's and its sandbox's
// layers are the same blobs) is hard-linked, and two fetches of one layer
// run one after the other, so it crosses the network once. It returns the
// file's path.
func (n *Node) Fetch(ctx context.Context, l repo.Layer, dir string) (string, error) {
	path := filepath.Join(dir, l.Digest.Hex())
	release, err := n.fetchTurn(ctx, l.Digest)
	if err != nil {
		return "", err
	}
	defer release()
	if st, err := os.Stat(path); err == nil && st.Size() == l.Size {
		n.Held.Add(l.Digest, path)
		n.dropLazy(l.Digest)
		return path, nil
	}
	if n.linkHeld(l, path) {
		n.Held.Add(l.Digest, path)
		n.dropLazy(l.Digest)
		return path, nil
	}
	c, err := n.OpenLayer(ctx, l)
	if err != nil {
		return "", err
	}
	defer c.Close()
	err = repo.FetchLayer(ctx, c, l, path)
	n.whole.Add(fetchedBytes(c))
	if err != nil {
		return "", err
	}
	n.Held.Add(l.Digest, path)
	n.dropLazy(l.Digest) // the layer socket reads the file from now on
	return path, nil
}

// fetchTurn waits until no other Fetch of d runs and returns the call that
// lets the next one go.
func (n *Node) fetchTurn(ctx context.Context, d repo.Digest) (func(), error) {
	for {
		n.mu.Lock()
		busy, ok := n.fetching[d]
		if !ok {
			if n.fetching == nil {
				n.fetching = map[repo.Digest]chan struct{}{}
			}
			mine := make(chan struct{})
			n.fetching[d] = mine
			n.mu.Unlock()
			return func() {
				n.mu.Lock()
				delete(n.fetching, d)
				n.mu.Unlock()
				close(mine)
			}, nil
		}
		n.mu.Unlock()
		select {
		case <-busy:
		case <-ctx.Done():
			return nil, fmt.Errorf("fetch layer %s: %w", d, ctx.Err())
		}
	}
}

// linkHeld hard-links the node's copy of l (Held) to path; false when it
// holds none that is whole and on the same file system.
func (n *Node) linkHeld(l repo.Layer, path string) bool {
	f, err := n.Held.OpenBlob(l.Digest)
	if err != nil {
		return false
	}
	of, ok := f.(*os.File)
	var src string
	if ok {
		src = of.Name()
	}
	f.Close()
	if st, err := os.Stat(src); !ok || err != nil || st.Size() != l.Size {
		return false
	}
	return os.Link(src, path) == nil
}

// FetchedWhole is the bytes Fetch read from peers and the store so far.
func (n *Node) FetchedWhole() int64 { return n.whole.Load() }

// OpenRecorded opens a layer like OpenLayer, recording the order of the
// blocks read (for RecordWorkingSet after a restore's first moments).
func (n *Node) OpenRecorded(ctx context.Context, l repo.Layer) (*blob.Cache, error) {
	return n.Peers.OpenLayer(ctx, n.Repo, l, n.cacheOptions(true))
}

// RecordWorkingSet stores the blocks c has read so far as l's working-set
// hint, for the next restore from l on any node.
func (n *Node) RecordWorkingSet(ctx context.Context, l repo.Layer, c *blob.Cache) error {
	return n.Repo.PutWorkingSet(ctx, l, c.BlockSize(), c.Touched())
}

// Prefetch fetches l's recorded working set into c (no hint: nothing to
// do), with a few requests at once; run it beside the restore.
func (n *Node) Prefetch(ctx context.Context, l repo.Layer, c *blob.Cache) error {
	blocks, err := n.Repo.WorkingSet(ctx, l, c.BlockSize())
	if errors.Is(err, repo.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return c.Prefetch(ctx, blocks, prefetchWorkers)
}

// prefetchWorkers is the number of requests a prefetch keeps in flight.
const prefetchWorkers = 4

// GC collects unreferenced blobs older than the configured grace period.
func (n *Node) GC(ctx context.Context) (repo.GCStats, error) {
	return n.Repo.GC(ctx, repo.GCOptions{Grace: n.cfg.GCGrace.Duration})
}
