package scheduler

import (
	"net/url"
	"slices"
	"sync"

	pb "github.com/agentenv/agentenv/cluster/schedulerpb"
)

// discovered holds the node endpoints discovery found (a static list or a
// Kubernetes Service): a node found but not registered is listed as down,
// so an operator sees a node that fails to join.
type discovered struct {
	mu    sync.Mutex
	addrs []string
}

// SetDiscovered replaces the node endpoints ("host:port" of their APIs)
// discovery reports (a discovery.Source's update function).
func (s *Scheduler) SetDiscovered(addrs []string) {
	s.disc.mu.Lock()
	s.disc.addrs = slices.Clone(addrs)
	s.disc.mu.Unlock()
}

// unregistered are discovered endpoints no registered node serves.
func (s *Scheduler) unregistered(nodes []*pb.Node) []*pb.Node {
	s.disc.mu.Lock()
	addrs := slices.Clone(s.disc.addrs)
	s.disc.mu.Unlock()
	known := map[string]bool{}
	for _, n := range nodes {
		if u, err := url.Parse(n.GetStatus().GetApiUrl()); err == nil {
			known[u.Host] = true
		}
	}
	var out []*pb.Node
	for _, a := range addrs {
		if !known[a] {
			out = append(out, &pb.Node{Status: &pb.NodeStatus{Name: a, ApiUrl: "http://" + a}, State: pb.NodeState_NODE_STATE_DOWN})
		}
	}
	return out
}
