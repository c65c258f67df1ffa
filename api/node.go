package api

import (
	"fmt"
	"net/http"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/network"
)

// NodeInfo identifies this node in /nodes.
type NodeInfo struct {
	ID, Version                     string
	Commit, Date                    string // the build's (internal/version)
	VMMDriver, VMMAccel, VMMReasons string
}

func (s *Server) node() wire.Node {
	st := s.o.NodeStats()
	status := wire.NodeStatusReady
	if s.draining.Load() {
		status = wire.NodeStatusDraining
	}
	return wire.Node{
		NodeID: s.opts.Node.ID, Status: status, Version: s.opts.Node.Version,
		Commit: nonEmpty(s.opts.Node.Commit), Date: nonEmpty(s.opts.Node.Date),
		Vmm:      wire.NodeVMM{Driver: s.opts.Node.VMMDriver, Accel: s.opts.Node.VMMAccel, Reason: ptr(s.opts.Node.VMMReasons)},
		CpuCount: int32(st.CPUCount), LoadAverage1m: ptr(st.LoadAverage1m),
		MemoryTotalMB: st.MemTotalMiB, MemoryUsedMB: st.MemUsedMiB, DiskTotalMB: st.DiskTotalMiB, DiskUsedMB: st.DiskUsedMiB,
		Sandboxes:    wire.NodeSandboxes{Running: int32(st.Running), Paused: int32(st.Paused), Total: int32(st.Total)},
		AllocatedCPU: int32(st.AllocatedCPU), AllocatedMemoryMB: st.AllocatedMemMiB,
		CreateSuccesses: st.CreateSuccesses, CreateFailures: st.CreateFailed,
		Memory: &wire.NodeMemory{Mode: wire.NodeMemoryMode(st.MemoryMode), Reason: st.MemoryReason,
			Images: int32(st.MemoryImages), Vms: int32(st.MemoryVMs)},
		Disks:   &wire.NodeDisks{Backend: s.o.DiskBackend(), Transport: s.o.DiskTransport()},
		VmmPool: s.vmmPool(),
	}
}

// vmmPool reports the warm pool of VMM processes (nil when it is off).
func (s *Server) vmmPool() *wire.NodeVMMPool {
	st, ok := s.o.PoolStats()
	if !ok {
		return nil
	}
	return &wire.NodeVMMPool{Ready: int32(st.Ready), Starting: int32(st.Starting), Low: int32(st.Low), High: int32(st.High),
		ReservedMB: int32(st.ReservedMiB), ReserveMB: int32(st.ReserveMiB), Hits: st.Hits, Misses: st.Misses}
}

// ListNodes implements ServerInterface: this node only.
func (s *Server) ListNodes(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, []wire.Node{s.node()})
}

// SetNodeStatus implements ServerInterface: draining refuses new
// sandboxes (creates and forks answer 503) and keeps the running ones;
// ready takes them again. The status is kept in Options.StateDir, so it
// outlasts a restart of aenvd.
func (s *Server) SetNodeStatus(w http.ResponseWriter, r *http.Request, nodeID string) {
	if nodeID != s.opts.Node.ID {
		writeError(w, http.StatusNotFound, "node "+nodeID+" not found")
		return
	}
	var req wire.NodeStatusChange
	if !decode(w, r, &req, true) {
		return
	}
	if req.Status != wire.NodeStatusChangeStatusDraining && req.Status != wire.NodeStatusChangeStatusReady {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("status %q is not ready or draining", req.Status))
		return
	}
	s.statusMu.Lock()
	defer s.statusMu.Unlock()
	if err := saveDraining(s.opts.StateDir, req.Status); err != nil {
		s.log.Error("node status not changed", "status", req.Status, "err", err)
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	s.draining.Store(req.Status == wire.NodeStatusChangeStatusDraining)
	s.log.Info("node status changed", "status", req.Status)
	w.WriteHeader(http.StatusNoContent)
}

// refuseWhileDraining answers 503 to a request for a new sandbox on a
// draining node; true when it did.
func (s *Server) refuseWhileDraining(w http.ResponseWriter) bool {
	if !s.draining.Load() {
		return false
	}
	w.Header().Set("Retry-After", "30")
	writeError(w, http.StatusServiceUnavailable, "node "+s.opts.Node.ID+" is draining: it takes no new sandboxes")
	return true
}

func nonEmpty(v string) *string {
	if v == "" {
		return nil
	}
	return &v
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
func (s *Server) UpdateSandboxNetwork(w http.ResponseWriter, r *http.Request, sandboxID wire.SandboxID) {
	var req wire.SandboxNetworkUpdate
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
func createPolicy(req wire.NewSandbox) network.Policy {
	var p network.Policy
	if req.AllowInternetAccess != nil {
		p.DenyInternet = !*req.AllowInternetAccess
	}
	if req.Network != nil {
		p.AllowOut, p.DenyOut = deref(req.Network.AllowOut), deref(req.Network.DenyOut)
	}
	return p
}
