package nodeagent

import (
	"context"
	"time"

	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
)

// refreshPeers hands Options.OnPeers the P2P endpoints of the other nodes
// that are up. A failed lookup keeps the last list (a peer that went is
// passed over at read time, and the object store stays the fallback).
func (a *Agent) refreshPeers(ctx context.Context) {
	if a.opts.OnPeers == nil {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	r, err := a.client().ListPeers(cctx, &pb.ListPeersRequest{Node: a.opts.Name})
	if err != nil {
		a.log.Debug("list peers", "err", err)
		return
	}
	var eps []string
	for _, p := range r.GetPeers() {
		eps = append(eps, p.GetP2PEndpoint())
	}
	a.opts.OnPeers(eps)
}
