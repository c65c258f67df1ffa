package api

import (
	"net/http"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/orchestrator"
	"github.com/agentenv/agentenv/volume"
)

// Volumes (E2B's /volumes): the node's volume store (package volume) in
// E2B's shapes. E2B's volume content API (the SDK's Volume file methods,
// a service of its own with a per-volume token) is not served: the token
// is empty.

func volumeAndToken(v volume.Volume) wire.VolumeAndToken {
	return wire.VolumeAndToken{VolumeID: v.ID, Name: v.Name, Token: "", SizeMiB: ptr(int32(v.SizeMiB)),
		CreatedAt: ptr(v.CreatedAt), MountedBy: ptr(nonNilSlice(v.Holders()))}
}

func nonNilSlice(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// CreateVolume implements ServerInterface.
func (s *Server) CreateVolume(w http.ResponseWriter, r *http.Request) {
	var req wire.NewVolume
	if !decode(w, r, &req, true) {
		return
	}
	v, err := s.o.Volumes().Create(r.Context(), req.Name, int(deref(req.SizeMiB)))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, volumeAndToken(v))
}

// ListVolumes implements ServerInterface.
func (s *Server) ListVolumes(w http.ResponseWriter, r *http.Request) {
	out := []wire.Volume{}
	for _, v := range s.o.Volumes().List() {
		if v.Config == "" {
			continue // being created
		}
		out = append(out, wire.Volume{VolumeID: v.ID, Name: v.Name, SizeMiB: ptr(int32(v.SizeMiB)),
			CreatedAt: ptr(v.CreatedAt), MountedBy: ptr(nonNilSlice(v.Holders()))})
	}
	writeJSON(w, http.StatusOK, out)
}

// GetVolume implements ServerInterface.
func (s *Server) GetVolume(w http.ResponseWriter, r *http.Request, volumeID string) {
	v, err := s.o.Volumes().Get(volumeID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, volumeAndToken(v))
}

// DeleteVolume implements ServerInterface: 409 while a sandbox mounts it.
func (s *Server) DeleteVolume(w http.ResponseWriter, r *http.Request, volumeID string) {
	if err := s.o.Volumes().Delete(volumeID); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// createVolumes is a create's volume mounts; the orchestrator validates
// them.
func createVolumes(in *[]wire.SandboxVolumeMount) []orchestrator.VolumeMount {
	if in == nil {
		return nil
	}
	out := make([]orchestrator.VolumeMount, 0, len(*in))
	for _, m := range *in {
		out = append(out, orchestrator.VolumeMount{Volume: m.Name, Path: m.Path, ReadOnly: deref(m.ReadOnly)})
	}
	return out
}

// volumeMounts describes a sandbox's volumes for GET /sandboxes/{id}.
func volumeMounts(drives []orchestrator.AttachedDrive) *[]wire.SandboxVolumeMount {
	var out []wire.SandboxVolumeMount
	for _, d := range drives {
		if d.Volume == "" {
			continue
		}
		m := wire.SandboxVolumeMount{Name: d.VolumeName, Path: d.MountPath}
		if d.ReadOnly {
			m.ReadOnly = ptr(true)
		}
		out = append(out, m)
	}
	if out == nil {
		return nil
	}
	return &out
}
