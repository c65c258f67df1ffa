package api

import (
	"net/http"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/orchestrator"
)

// GetSandboxMemory implements ServerInterface (an aenvd extension).
func (s *Server) GetSandboxMemory(w http.ResponseWriter, r *http.Request, sandboxID wire.SandboxID) {
	m, err := s.o.Memory(r.Context(), sandboxID)
	if err != nil {
		s.failVMM(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, memoryOf(m))
}

// ResizeSandboxMemory implements ServerInterface (an aenvd extension).
func (s *Server) ResizeSandboxMemory(w http.ResponseWriter, r *http.Request, sandboxID wire.SandboxID) {
	// memoryMB is required: a body without it must not resize to zero.
	var req struct {
		MemoryMB *int32 `json:"memoryMB"`
	}
	if !decode(w, r, &req, true) {
		return
	}
	if req.MemoryMB == nil {
		writeError(w, http.StatusBadRequest, "memoryMB is required")
		return
	}
	m, err := s.o.ResizeMemory(r.Context(), sandboxID, int(*req.MemoryMB))
	if err != nil {
		s.failVMM(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, memoryOf(m))
}

func memoryOf(m orchestrator.SandboxMemory) wire.SandboxMemory {
	out := wire.SandboxMemory{CeilingMB: int32(m.CeilingMiB), TargetMB: int32(m.TargetMiB)}
	if m.RequestedMiB > 0 {
		out.RequestedMB = ptr(int32(m.RequestedMiB))
	}
	if m.ActualMiB > 0 {
		out.ActualMB, out.Complete = ptr(int32(m.ActualMiB)), ptr(m.Complete)
	}
	return out
}
