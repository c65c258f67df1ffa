package api

import "net/http"

// Snapshots and forks (issue #8).

// ForkSandbox implements ServerInterface.
func (s *Server) ForkSandbox(w http.ResponseWriter, r *http.Request, sandboxID SandboxID) {
	writeError(w, http.StatusNotImplemented, "fork is not implemented yet")
}

// CreateSnapshot implements ServerInterface.
func (s *Server) CreateSnapshot(w http.ResponseWriter, r *http.Request, sandboxID SandboxID) {
	writeError(w, http.StatusNotImplemented, "snapshots are not implemented yet")
}

// ListSnapshots implements ServerInterface.
func (s *Server) ListSnapshots(w http.ResponseWriter, r *http.Request, params ListSnapshotsParams) {
	writeError(w, http.StatusNotImplemented, "snapshots are not implemented yet")
}

// GetSnapshot implements ServerInterface.
func (s *Server) GetSnapshot(w http.ResponseWriter, r *http.Request, snapshotID string) {
	writeError(w, http.StatusNotImplemented, "snapshots are not implemented yet")
}

// DeleteSnapshot implements ServerInterface.
func (s *Server) DeleteSnapshot(w http.ResponseWriter, r *http.Request, snapshotID string) {
	writeError(w, http.StatusNotImplemented, "snapshots are not implemented yet")
}
