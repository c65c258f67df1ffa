package reponode

import (
	"context"
	"log/slog"
	"time"
)

// The node collects the repository's garbage every gc_interval: blobs no
// manifest references and no commit in progress holds, older than gc_grace
// (repo.Repo.GC). Nodes sharing a repository may all run it: a collection
// never races a commit (the lease and marker protocol), and two collections
// only delete what both found unreferenced.

// collect runs a collection every interval until ctx ends.
func (n *Node) collect(ctx context.Context, every time.Duration) {
	defer n.wg.Done()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		start := time.Now()
		st, err := n.GC(ctx)
		if err != nil {
			if ctx.Err() == nil {
				slog.Warn("snapshot repository: garbage collection failed (the next interval retries)", "store", n.Repo.String(), "err", err)
			}
			continue
		}
		slog.Info("snapshot repository: garbage collected", "store", n.Repo.String(), "manifests", st.Manifests,
			"referenced", st.Referenced, "protected", st.Protected, "young", st.Young, "deleted", len(st.Deleted),
			"freed_bytes", st.Freed, "took", time.Since(start).Round(time.Millisecond))
		n.gcRuns.Add(1)
	}
}

// GCRuns is how many periodic collections completed.
func (n *Node) GCRuns() int64 { return n.gcRuns.Load() }
