package api

import (
	"errors"
	"net/http"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/orchestrator"
	"github.com/agentenv/agentenv/vmm"
)

// GetSandboxCPUs implements ServerInterface (an aenvd extension).
func (s *Server) GetSandboxCPUs(w http.ResponseWriter, r *http.Request, sandboxID wire.SandboxID) {
	p, err := s.o.CPUPinning(r.Context(), sandboxID)
	if err != nil {
		s.failVMM(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, cpusOf(p))
}

// PinSandboxCPUs implements ServerInterface (an aenvd extension).
func (s *Server) PinSandboxCPUs(w http.ResponseWriter, r *http.Request, sandboxID wire.SandboxID) {
	// pin is required: a body without it must not unpin by accident.
	var req struct {
		Pin *string `json:"pin"`
	}
	if !decode(w, r, &req, true) {
		return
	}
	if req.Pin == nil {
		writeError(w, http.StatusBadRequest, `pin is required ("" removes the pinning)`)
		return
	}
	p, err := s.o.PinCPUs(r.Context(), sandboxID, *req.Pin)
	if err != nil {
		s.failVMM(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, cpusOf(p))
}

// failVMM answers a VMM that lacks the capability (pinning, resizing) with 501, the rest as fail does.
func (s *Server) failVMM(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, vmm.ErrUnsupported) {
		writeError(w, http.StatusNotImplemented, err.Error())
		return
	}
	s.fail(w, r, err)
}

func cpusOf(p orchestrator.CPUPinning) wire.SandboxCPUs {
	out := wire.SandboxCPUs{Pin: p.Pin, Vcpus: int32(p.VCPUs)}
	if p.Threads != nil {
		threads := make([]wire.SandboxVCPUThread, 0, len(p.Threads))
		for _, t := range p.Threads {
			threads = append(threads, wire.SandboxVCPUThread{Vcpu: int32(t.VCPU), ThreadID: int32(t.ThreadID), Cpus: t.CPUs})
		}
		out.Threads = &threads
	}
	return out
}
