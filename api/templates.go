package api

import "net/http"

// Template builds (E2B's v2/v3 template API, issue #10).

// ListTemplatesV2 implements ServerInterface.
func (s *Server) ListTemplatesV2(w http.ResponseWriter, r *http.Request) { s.ListTemplates(w, r) }

// DeleteTemplate implements ServerInterface.
func (s *Server) DeleteTemplate(w http.ResponseWriter, r *http.Request, templateID string) {
	writeError(w, http.StatusNotImplemented, "template deletion is not implemented yet")
}

// GetTemplateAlias implements ServerInterface.
func (s *Server) GetTemplateAlias(w http.ResponseWriter, r *http.Request, alias string) {
	writeError(w, http.StatusNotImplemented, "template aliases are not implemented yet")
}

// CreateTemplateV3 implements ServerInterface.
func (s *Server) CreateTemplateV3(w http.ResponseWriter, r *http.Request) {
	writeError(w, http.StatusNotImplemented, "template builds are not implemented yet")
}

// StartTemplateBuildV2 implements ServerInterface.
func (s *Server) StartTemplateBuildV2(w http.ResponseWriter, r *http.Request, templateID string, buildID string) {
	writeError(w, http.StatusNotImplemented, "template builds are not implemented yet")
}

// GetTemplateBuildStatus implements ServerInterface.
func (s *Server) GetTemplateBuildStatus(w http.ResponseWriter, r *http.Request, templateID string, buildID string, params GetTemplateBuildStatusParams) {
	writeError(w, http.StatusNotImplemented, "template builds are not implemented yet")
}

// GetTemplateFiles implements ServerInterface.
func (s *Server) GetTemplateFiles(w http.ResponseWriter, r *http.Request, templateID string, hash string) {
	writeError(w, http.StatusNotImplemented, "template files are not implemented yet")
}

// UploadTemplateFiles implements ServerInterface.
func (s *Server) UploadTemplateFiles(w http.ResponseWriter, r *http.Request, templateID string, hash string) {
	writeError(w, http.StatusNotImplemented, "template files are not implemented yet")
}
