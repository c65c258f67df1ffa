package api

import (
	"fmt"
	"net/http"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/snapshot"
)

// Snapshots and forks (issue #8): a snapshot captures a sandbox while it
// keeps running; its id or name works as a templateID on create.

// ForkSandbox implements ServerInterface: 201 with one result per child.
func (s *Server) ForkSandbox(w http.ResponseWriter, r *http.Request, sandboxID wire.SandboxID) {
	if s.refuseWhileDraining(w) {
		return
	}
	var req wire.SandboxFork
	if !decode(w, r, &req, true) {
		return
	}
	if req.Count < 1 || req.Count > 100 {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("count %d is not within 1..100", req.Count))
		return
	}
	var timeout = s.opts.DefaultTimeout
	if req.Timeout != nil {
		var ok bool
		if timeout, ok = s.timeout(w, req.Timeout); !ok {
			return
		}
	}
	results, err := s.o.Fork(r.Context(), sandboxID, int(req.Count), timeout)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if src, err := s.o.Get(sandboxID); err == nil {
		s.publishFork(src)
	}
	out := make([]wire.ForkResult, len(results))
	for i, res := range results {
		if res.Err != nil {
			out[i].Error = &wire.Error{Code: int32(statusOf(res.Err)), Message: res.Err.Error()}
			continue
		}
		out[i].Sandbox = ptr(s.sandbox(res.Sandbox))
	}
	writeJSON(w, http.StatusCreated, out)
}

// CreateSnapshot implements ServerInterface.
func (s *Server) CreateSnapshot(w http.ResponseWriter, r *http.Request, sandboxID wire.SandboxID) {
	var req wire.NewSnapshot
	if !decode(w, r, &req, false) {
		return
	}
	snap, err := s.o.CreateSnapshot(r.Context(), sandboxID, deref(req.Name))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.snapshotInfo(snap))
}

// ListSnapshots implements ServerInterface: newest first, paged by
// nextToken (the id of the last snapshot of the previous page).
func (s *Server) ListSnapshots(w http.ResponseWriter, r *http.Request, params wire.ListSnapshotsParams) {
	limit := 100
	if params.Limit != nil {
		if *params.Limit < 1 || *params.Limit > 100 {
			writeError(w, http.StatusBadRequest, "limit must be within 1..100")
			return
		}
		limit = int(*params.Limit)
	}
	all, err := s.o.Snapshots(deref(params.SandboxID), deref(params.Name))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	start := 0
	if tok := deref(params.NextToken); tok != "" {
		start = -1
		for i, snap := range all {
			if snap.ID == tok {
				start = i + 1
			}
		}
		if start < 0 {
			writeError(w, http.StatusBadRequest, "nextToken names no snapshot (deleted, or not from this listing)")
			return
		}
	}
	end := min(start+limit, len(all))
	out := make([]wire.SnapshotInfo, 0, end-start)
	for _, snap := range all[start:end] {
		out = append(out, s.snapshotInfo(snap))
	}
	if end < len(all) {
		w.Header().Set("X-Next-Token", all[end-1].ID)
	}
	writeJSON(w, http.StatusOK, out)
}

// GetSnapshot implements ServerInterface (by id or name).
func (s *Server) GetSnapshot(w http.ResponseWriter, r *http.Request, snapshotID string) {
	snap, err := s.o.Snapshot(snapshotID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, s.snapshotInfo(snap))
}

// DeleteSnapshot implements ServerInterface: 409 while sandboxes use it.
func (s *Server) DeleteSnapshot(w http.ResponseWriter, r *http.Request, snapshotID string) {
	if err := s.o.DeleteSnapshot(snapshotID); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) snapshotInfo(r snapshot.Record) wire.SnapshotInfo {
	mem, rootfs := r.LayerCounts()
	names := r.Names
	if names == nil {
		names = []string{}
	}
	info := wire.SnapshotInfo{SnapshotID: r.ID, Names: names, SandboxID: r.SandboxID, TemplateID: r.TemplateID,
		CreatedAt: r.CreatedAt, CpuCount: ptr(int32(r.VCPUs)), MemoryMB: ptr(int32(r.MemoryMiB)),
		MemoryLayers: int32(mem), RootfsLayers: int32(rootfs)}
	if s.opts.Repository == nil {
		return info
	}
	if st, ok := s.opts.Repository.SnapshotStatus(r.ID); ok {
		info.Repository = ptr(string(st.State))
		if st.Error != "" {
			info.RepositoryError = ptr(st.Error)
		}
	}
	return info
}
