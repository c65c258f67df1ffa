package reponode

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/agentenv/agentenv/snapshot/repo"
)

// Working-set hints of lazily read layers. A guest restored on a node that
// lacks its layers faults one page at a time, and each fault the layer
// socket cannot serve from its cache is a verified range read of a peer or
// the store: a restore is a few hundred such reads in a row. The first
// node to read a layer lazily records the blocks it read until the layer
// was local (its first moments: the restore, the agent's answer) as the
// layer's hint in the repository (repo.PutWorkingSet); a node that opens
// the layer lazily later fetches the hinted blocks ahead of the guest,
// several requests at once (Node.Prefetch), while the guest's own reads
// wait only for blocks still missing. A hint only orders fetches: a wrong
// or stale one costs bandwidth, never bytes (every block is verified).

// hintJobs are the prefetches the layer socket runs; close stops and waits
// for them.
type hintJobs struct {
	ctx  context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup
}

// prefetchHint starts fetching the hinted blocks of ll's layer into its
// cache, or marks ll for recording when the repository holds no hint of
// it; ll.stopHint stops it.
func (n *Node) prefetchHint(ls *lazyServer, ll *lazyLayer) {
	ctx, cancel := context.WithCancel(ls.hints.ctx)
	done := make(chan struct{})
	ll.stopHint, ll.hinted = func() { cancel(); <-done }, done
	l := ll.layer
	ls.hints.wg.Add(1)
	go func() {
		defer ls.hints.wg.Done()
		defer close(done)
		start := time.Now()
		blocks, err := n.Repo.WorkingSet(ctx, l, ll.c.BlockSize())
		if errors.Is(err, repo.ErrNotFound) {
			ll.unhinted.Store(true)
			return
		}
		if err == nil {
			err = ll.c.Prefetch(ctx, blocks, prefetchWorkers)
		}
		if err != nil && ctx.Err() == nil {
			slog.Warn("snapshot repository: prefetch of a layer's working set failed (its reads fetch on demand)", "layer", l.Digest, "err", err)
			return
		}
		slog.Debug("snapshot repository: layer working set prefetched", "layer", l.Digest, "blocks", len(blocks), "took", time.Since(start))
	}()
}

// recordHint stores the blocks ll's cache read as its layer's hint when
// the repository held none at its open (the layer is local now: its lazy
// reads are over).
func (n *Node) recordHint(ls *lazyServer, ll *lazyLayer) {
	touched := ll.c.Touched()
	if !ll.unhinted.Load() || len(touched) == 0 {
		return
	}
	l, d := ll.layer, ll.layer.Digest
	ctx, cancel := context.WithTimeout(ls.hints.ctx, 30*time.Second)
	defer cancel()
	if err := n.Repo.PutWorkingSet(ctx, l, ll.c.BlockSize(), touched); err != nil {
		slog.Warn("snapshot repository: record a layer's working set (the next lazy read goes without)", "layer", d, "err", err)
		return
	}
	slog.Info("snapshot repository: layer working set recorded", "layer", d, "blocks", len(touched))
}

// hintPrefetched waits until the prefetch of layer d's hint, opened for
// lazy reads, ended (tests: what it fetched is in the cache then).
func (n *Node) hintPrefetched(ctx context.Context, d repo.Digest) error {
	ls := n.lazyState()
	if ls == nil {
		return errors.New("the layer socket is closed")
	}
	ls.mu.Lock()
	ll, ok := ls.open[d]
	ls.mu.Unlock()
	if !ok {
		return fmt.Errorf("layer %s is not open for lazy reads", d)
	}
	select {
	case <-ll.ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	if ll.hinted == nil {
		return fmt.Errorf("layer %s did not open: %w", d, ll.err)
	}
	select {
	case <-ll.hinted:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
