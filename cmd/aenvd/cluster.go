package main

import (
	"context"
	"log/slog"
	"sync"

	"github.com/agentenv/agentenv/cluster/nodeagent"
	"github.com/agentenv/agentenv/config"
	"github.com/agentenv/agentenv/internal/version"
	"github.com/agentenv/agentenv/orchestrator"
)

// orchestratorSource reports the node to the cluster scheduler from the
// orchestrator's own figures.
type orchestratorSource struct {
	o          *orchestrator.Orchestrator
	overcommit int
}

func (s orchestratorSource) Usage() nodeagent.Usage {
	st := s.o.NodeStats()
	u := nodeagent.Usage{CPUs: st.CPUCount * s.overcommit, MemoryMB: st.MemTotalMiB, FreeMemoryMB: st.MemTotalMiB - st.MemUsedMiB}
	u.FreeCPUs = max(u.CPUs-st.AllocatedCPU, 0)
	for _, r := range s.o.List() {
		u.Roster = append(u.Roster, nodeagent.Sandbox{ID: r.ID, State: string(r.State), CPUs: r.VCPUs, MemoryMB: int64(r.MemoryMiB)})
	}
	return u
}

// joinCluster starts the node's cluster membership when [cluster] lists a
// scheduler; the returned stop unregisters and waits. Without one it does
// nothing.
func joinCluster(ctx context.Context, cfg config.Config, o *orchestrator.Orchestrator, vmm, hostname string, log *slog.Logger) (stop func(), err error) {
	cc := cfg.Cluster
	if len(cc.Schedulers) == 0 {
		return func() {}, nil
	}
	name, url := cc.NodeName, cc.AdvertiseURL
	if name == "" {
		name = hostname
	}
	if url == "" {
		url = "http://" + cfg.API.Listen
	}
	a, err := nodeagent.New(nodeagent.Options{Schedulers: cc.Schedulers, Name: name, APIURL: url, P2PEndpoint: cc.P2PEndpoint,
		VMM: vmm, Version: version.Version(), MaxSandboxes: cc.MaxSandboxes,
		Source: orchestratorSource{o: o, overcommit: cc.CPUOvercommit}, Logger: log.With("component", "cluster")})
	if err != nil {
		return nil, err
	}
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = a.Run(actx) }()
	return func() { cancel(); wg.Wait(); a.Close() }, nil
}
