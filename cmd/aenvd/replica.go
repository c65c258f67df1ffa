package main

import (
	"log/slog"

	"github.com/agentenv/agentenv/api"
	"github.com/agentenv/agentenv/orchestrator"
	"github.com/agentenv/agentenv/replica"
	"github.com/agentenv/agentenv/vmm"
)

// attach joins the repository to the orchestrator's hooks (package
// replica): commits after pauses, snapshots and template builds, imports
// before a create or connect resolves what this node lacks, cancelled
// uploads after removals. Called once, after orchestrator.New and before
// its builds are enabled and the uploader starts.
func (r *repoNode) attach(o *orchestrator.Orchestrator, dataDir string, drv vmm.Driver, log *slog.Logger) {
	if r == nil {
		return
	}
	r.rep = replica.New(replica.Options{Uploads: r.n, Remote: r.n, DataDir: dataDir, Driver: drv, Logger: log,
		LazyMemory: o.MemoryExports()}, o.ReplicaNode())
	o.AttachReplica(r.rep)
}

// status reports the snapshots' commits to the API (nil when the node has
// no repository).
func (r *repoNode) status() api.RepositoryStatus {
	if r == nil || r.rep == nil {
		return nil
	}
	return r.rep
}
