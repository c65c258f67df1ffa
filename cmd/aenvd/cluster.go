package main

import (
	"context"
	"log/slog"
	"net"
	"strings"
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

// DropCopy removes the node's stale copy of a sandbox the cluster resumed
// on another node (orchestrator.DropCopy: local state only).
func (s orchestratorSource) DropCopy(ctx context.Context, id string) (string, error) {
	st, err := s.o.DropCopy(ctx, id)
	return string(st), err
}

// joinCluster starts the node's cluster membership when [cluster] lists a
// scheduler; the returned stop unregisters and waits. Without one it does
// nothing.
func joinCluster(ctx context.Context, cfg config.Config, o *orchestrator.Orchestrator, rn *repoNode, vmm, hostname string, log *slog.Logger) (stop func(), err error) {
	cc := cfg.Cluster
	if len(cc.Scheduler) == 0 {
		return func() {}, nil
	}
	name, url := cc.NodeName, cc.AdvertiseURL
	if name == "" {
		name = hostname
	}
	if url == "" {
		url = "http://" + advertiseAddr(cfg.API.Listen, cfg.Network.Prefix)
	}
	var onPeers func([]string) // layers are read from peers only with a repository
	if rn != nil {
		onPeers = rn.setPeers
	}
	a, err := nodeagent.New(nodeagent.Options{Schedulers: cc.Scheduler, Name: name, APIURL: url, P2PEndpoint: cc.P2PEndpoint,
		VMM: vmm, Version: version.Version(), MaxSandboxes: cc.MaxSandboxes,
		Source: orchestratorSource{o: o, overcommit: cc.CPUOvercommit}, Logger: log.With("component", "cluster"),
		OnPeers: onPeers})
	if err != nil {
		return nil, err
	}
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = a.Run(actx) }()
	return func() { cancel(); wg.Wait(); a.Close() }, nil
}

// advertiseAddr is the listen address as others reach it: an unspecified
// host (0.0.0.0, "") becomes the first IPv4 address of the host's
// interfaces, by index, skipping loopback and the sandbox slots' veths.
func advertiseAddr(listen, slotPrefix string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		return listen
	}
	ifs, err := net.Interfaces()
	if err != nil {
		return listen
	}
	for _, ifc := range ifs {
		if ifc.Flags&net.FlagLoopback != 0 || ifc.Flags&net.FlagUp == 0 || strings.HasPrefix(ifc.Name, slotPrefix) {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil {
				return net.JoinHostPort(n.IP.String(), port)
			}
		}
	}
	return listen
}
