package reponode_test

import (
	"context"
	"log/slog"
	"time"

	"github.com/agentenv/agentenv/config"
	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/snapshot/repo/reponode"
	"github.com/agentenv/agentenv/snapshot/repo/upload"
)

// How the node server wires the repository in (compiled, not run).
func Example() {
	ctx := context.Background()
	cfg, _ := config.Load("/etc/aenv/aenvd.toml")
	node, err := reponode.Open(ctx, cfg) // one clear error for a wrong bucket or credentials
	if err != nil || node == nil {       // nil: backend "none"
		return
	}
	if err := node.Start(ctx); err != nil {
		return
	}
	defer node.Close()

	// After a pause or snapshot is durable locally: upload it in the background.
	_ = node.Commit(ctx, upload.Job{Name: "snap-7f3a", Kind: repo.KindSnapshot, Parent: "base", Created: time.Now(),
		Rootfs: []string{"/var/lib/aenv/snapshots/snap-7f3a/rootfs-1.lsmt"},
		Memory: []string{"/var/lib/aenv/snapshots/snap-7f3a/memory-1.lsmt"},
		State:  "/var/lib/aenv/snapshots/snap-7f3a/vmstate", Config: "/var/lib/aenv/snapshots/snap-7f3a/config.json"})
	if st, ok := node.Status("snap-7f3a"); ok {
		slog.Info("upload", "state", st.State, "error", st.Error)
	}
	// Serve the sealed layers this node holds to its peers.
	node.Held.Add(repo.Digest("sha256:…"), "/var/lib/aenv/snapshots/snap-7f3a/rootfs-1.lsmt")

	// On another node: resume from the repository, lazily and verified.
	m, err := node.Repo.Manifest(ctx, "snap-7f3a")
	if err != nil {
		return
	}
	mem, err := node.OpenRecorded(ctx, m.Memory[0]) // an io.ReaderAt for the memory image
	if err != nil {
		return
	}
	defer mem.Close()
	prefetched := make(chan error, 1) // the prefetch runs beside the restore
	go func() { prefetched <- node.Prefetch(ctx, m.Memory[0], mem) }()
	state, _ := repo.ReadSmallBlob(ctx, node.Repo, m.State, 64<<20)
	_ = state
	// ... restore the VM from mem and state; once it runs:
	if err := <-prefetched; err != nil {
		slog.Warn("prefetch", "err", err)
	}
	_ = node.RecordWorkingSet(ctx, m.Memory[0], mem)
}
