package api

import (
	"net/http"

	"github.com/agentenv/agentenv/network"
)

// NodeInfo identifies this node in /nodes.
type NodeInfo struct {
	ID, Version                     string
	VMMDriver, VMMAccel, VMMReasons string
}

func (s *Server) node() Node {
	st := s.o.NodeStats()
	return Node{
		NodeID: s.opts.Node.ID, Status: NodeStatusReady, Version: s.opts.Node.Version,
		Vmm:      NodeVMM{Driver: s.opts.Node.VMMDriver, Accel: s.opts.Node.VMMAccel, Reason: ptr(s.opts.Node.VMMReasons)},
		CpuCount: int32(st.CPUCount), LoadAverage1m: ptr(st.LoadAverage1m),
		MemoryTotalMB: st.MemTotalMiB, MemoryUsedMB: st.MemUsedMiB, DiskTotalMB: st.DiskTotalMiB, DiskUsedMB: st.DiskUsedMiB,
		Sandboxes:    NodeSandboxes{Running: int32(st.Running), Paused: int32(st.Paused), Total: int32(st.Total)},
		AllocatedCPU: int32(st.AllocatedCPU), AllocatedMemoryMB: st.AllocatedMemMiB,
		CreateSuccesses: st.CreateSuccesses, CreateFailures: st.CreateFailed,
		Memory: &NodeMemory{Mode: NodeMemoryMode(st.MemoryMode), Reason: st.MemoryReason,
			Images: int32(st.MemoryImages), Vms: int32(st.MemoryVMs)},
	}
}

// ListNodes implements ServerInterface: this node only.
func (s *Server) ListNodes(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, []Node{s.node()})
}

// GetNode implements ServerInterface.
func (s *Server) GetNode(w http.ResponseWriter, r *http.Request, nodeID string) {
	if nodeID != s.opts.Node.ID {
		writeError(w, http.StatusNotFound, "node "+nodeID+" not found")
		return
	}
	writeJSON(w, http.StatusOK, s.node())
}

// UpdateSandboxNetwork implements ServerInterface.
func (s *Server) UpdateSandboxNetwork(w http.ResponseWriter, r *http.Request, sandboxID SandboxID) {
	var req SandboxNetworkUpdate
	if !decode(w, r, &req, true) {
		return
	}
	p := network.Policy{AllowOut: deref(req.AllowOut), DenyOut: deref(req.DenyOut)}
	if req.AllowInternetAccess != nil {
		p.DenyInternet = !*req.AllowInternetAccess
	}
	if err := s.o.SetPolicy(r.Context(), sandboxID, p); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// createPolicy reads the egress policy of a create request.
func createPolicy(req NewSandbox) network.Policy {
	var p network.Policy
	if req.AllowInternetAccess != nil {
		p.DenyInternet = !*req.AllowInternetAccess
	}
	if req.Network != nil {
		p.AllowOut, p.DenyOut = deref(req.Network.AllowOut), deref(req.Network.DenyOut)
	}
	return p
}
