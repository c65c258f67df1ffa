package api

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/orchestrator"
	"github.com/agentenv/agentenv/template"
)

// Template builds (E2B's v2/v3 template API, issue #10): the handlers map
// requests onto the orchestrator's builds (orchestrator/build.go).

// builtTemplate maps any template (built, building or the default) to E2B's
// Template.
func (s *Server) builtTemplate(t template.Template) wire.Template {
	names := t.Names
	if len(names) == 0 {
		names = []string{t.ID}
	}
	status := wire.TemplateBuildStatusReady
	buildID := t.BuildID
	if br := t.Builds[t.LatestBuild]; br != nil {
		status = wire.TemplateBuildStatus(br.Status)
		if buildID == "" {
			buildID = br.ID
		}
	}
	if buildID == "" {
		buildID = t.ID
	}
	updated := t.UpdatedAt
	if updated.IsZero() {
		updated = t.CreatedAt
	}
	count := int32(len(t.Builds))
	if count == 0 {
		count = 1
	}
	return wire.Template{
		TemplateID: t.ID, BuildID: buildID, CpuCount: int32(t.VCPUs), MemoryMB: int32(t.MemoryMiB), DiskSizeMB: int32(t.DiskMiB),
		Public: s.public(t.ID), Aliases: names, Names: ptr(names), CreatedAt: t.CreatedAt, UpdatedAt: updated,
		EnvdVersion: t.EnvdVersion, BuildStatus: status, BuildCount: &count,
	}
}

// ListTemplatesV2 implements ServerInterface: every template, also those
// waiting for or failing their build.
func (s *Server) ListTemplatesV2(w http.ResponseWriter, r *http.Request) {
	out := []wire.Template{}
	for _, t := range s.o.AllTemplates() {
		out = append(out, s.builtTemplate(t))
	}
	writeJSON(w, http.StatusOK, out)
}

// DeleteTemplate implements ServerInterface for templates and snapshots:
// 409 while a sandbox (running or paused) or another template built from
// it still uses it.
func (s *Server) DeleteTemplate(w http.ResponseWriter, r *http.Request, templateID string) {
	// E2B's SDK deletes snapshots here too (Sandbox.deleteSnapshot): a
	// snapshot's id or name is a templateID on create, so it is one here.
	if _, err := s.o.Snapshot(templateID); err == nil {
		s.DeleteSnapshot(w, r, templateID)
		return
	}
	if _, err := s.o.ResolveTemplate(templateID); errors.Is(err, orchestrator.ErrNotFound) {
		// 404 even on a node without builds: the SDK reads it as "not found".
		writeError(w, http.StatusNotFound, fmt.Sprintf("no template or snapshot %q", templateID))
		return
	}
	if err := s.o.DeleteTemplate(r.Context(), templateID); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// GetTemplateAlias implements ServerInterface.
func (s *Server) GetTemplateAlias(w http.ResponseWriter, r *http.Request, alias string) {
	t, err := s.o.ResolveTemplate(alias)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, wire.TemplateAliasResponse{TemplateID: t.ID, Public: s.public(t.ID)})
}

// CreateTemplateV3 implements ServerInterface: 202 with the template and
// its first (or, for an existing name, next) build, waiting for its spec.
func (s *Server) CreateTemplateV3(w http.ResponseWriter, r *http.Request) {
	var req wire.TemplateBuildRequestV3
	if !decode(w, r, &req, true) {
		return
	}
	name := deref(req.Name)
	if name == "" {
		name = deref(req.Alias)
	}
	t, buildID, err := s.o.CreateTemplate(template.Request{
		Name: name, Tags: deref(req.Tags), VCPUs: int(deref(req.CpuCount)), MemoryMiB: int(deref(req.MemoryMB)),
	})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	names := t.Names
	if names == nil {
		names = []string{}
	}
	tags := t.Tags
	if tags == nil {
		tags = []string{}
	}
	writeJSON(w, http.StatusAccepted, wire.TemplateRequestResponseV3{
		TemplateID: t.ID, BuildID: buildID, Names: names, Aliases: names, Public: s.public(t.ID), Tags: tags,
	})
}

// StartTemplateBuildV2 implements ServerInterface: 202 once the build is
// queued; its progress is GET .../builds/{buildID}/status.
func (s *Server) StartTemplateBuildV2(w http.ResponseWriter, r *http.Request, templateID string, buildID string) {
	var req wire.TemplateBuildStartV2
	if !decode(w, r, &req, true) {
		return
	}
	spec := template.BuildSpec{
		FromImage: deref(req.FromImage), FromTemplate: deref(req.FromTemplate), Force: deref(req.Force),
		StartCmd: deref(req.StartCmd), ReadyCmd: deref(req.ReadyCmd),
	}
	for _, st := range deref(req.Steps) {
		spec.Steps = append(spec.Steps, template.BuildStep{
			Type: st.Type, Args: deref(st.Args), FilesHash: deref(st.FilesHash), Force: deref(st.Force),
		})
	}
	if err := s.o.StartBuild(templateID, buildID, spec); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

// GetTemplateBuildStatus implements ServerInterface.
func (s *Server) GetTemplateBuildStatus(w http.ResponseWriter, r *http.Request, templateID string, buildID string, params wire.GetTemplateBuildStatusParams) {
	offset, limit := 0, 100
	if params.LogsOffset != nil {
		if *params.LogsOffset < 0 {
			writeError(w, http.StatusBadRequest, "logsOffset must not be negative")
			return
		}
		offset = int(*params.LogsOffset)
	}
	if params.Limit != nil {
		if *params.Limit < 0 || *params.Limit > 100 {
			writeError(w, http.StatusBadRequest, "limit must be 0..100")
			return
		}
		limit = int(*params.Limit)
	}
	level := ""
	if params.Level != nil {
		level = string(*params.Level)
		if !wire.BuildLogEntryLevel(level).Valid() {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("level %q: want debug, info, warn or error", level))
			return
		}
	}
	st, err := s.o.BuildStatusOf(templateID, buildID, offset, limit, level)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := wire.TemplateBuildInfo{TemplateID: st.TemplateID, BuildID: st.BuildID, Status: wire.TemplateBuildInfoStatus(st.Status),
		Logs: []string{}, LogEntries: []wire.BuildLogEntry{}}
	for _, l := range st.Logs {
		out.LogEntries = append(out.LogEntries, logEntry(l))
		out.Logs = append(out.Logs, fmt.Sprintf("%s [%s] %s", l.Timestamp.Format("2006-01-02T15:04:05.000Z07:00"), l.Level, l.Message))
	}
	if st.Status == template.BuildError {
		reason := &wire.BuildStatusReason{Message: st.Reason}
		if st.ReasonStep != "" {
			reason.Step = ptr(st.ReasonStep)
		}
		if len(st.ReasonLogs) > 0 {
			entries := make([]wire.BuildLogEntry, 0, len(st.ReasonLogs))
			for _, l := range st.ReasonLogs {
				entries = append(entries, logEntry(l))
			}
			reason.LogEntries = &entries
		}
		out.Reason = reason
	}
	writeJSON(w, http.StatusOK, out)
}

func logEntry(l template.BuildLog) wire.BuildLogEntry {
	e := wire.BuildLogEntry{Timestamp: l.Timestamp, Level: wire.BuildLogEntryLevel(l.Level), Message: l.Message}
	if l.Step != "" {
		e.Step = ptr(l.Step)
	}
	return e
}

// GetTemplateFiles implements ServerInterface: 201 {present, url}; url is
// this server's PUT /templates/{id}/files/{hash} with an upload token, so
// it needs no X-API-Key.
func (s *Server) GetTemplateFiles(w http.ResponseWriter, r *http.Request, templateID string, hash string) {
	present, err := s.o.TemplateFilesPresent(templateID, hash)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := wire.TemplateBuildFileUpload{Present: present}
	if !present {
		out.Url = ptr(uploadURL(r, templateID, hash, uploadToken(s.opts.APIKey, templateID, hash)))
	}
	writeJSON(w, http.StatusCreated, out)
}

// uploadURL is the absolute URL of the upload route as the client reached
// this server, with the upload's token (uploadtoken.go).
func uploadURL(r *http.Request, templateID, hash, token string) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	if p := r.Header.Get("X-Forwarded-Proto"); p == "http" || p == "https" {
		scheme = p
	}
	u := url.URL{Scheme: scheme, Host: r.Host, Path: "/templates/" + templateID + "/files/" + hash,
		RawQuery: url.Values{uploadTokenParam: {token}}.Encode()}
	return u.String()
}

// UploadTemplateFiles implements ServerInterface: the body is streamed to
// disk under hash, the client's key for it (template/files.go).
func (s *Server) UploadTemplateFiles(w http.ResponseWriter, r *http.Request, templateID string, hash string) {
	if ct := r.Header.Get("Content-Type"); ct != "" && strings.HasPrefix(ct, "multipart/") {
		writeError(w, http.StatusBadRequest, "send the archive as the raw body (application/octet-stream), not multipart")
		return
	}
	if r.ContentLength > template.MaxTemplateFiles {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("archive larger than %d bytes", int64(template.MaxTemplateFiles)))
		return
	}
	if err := s.o.PutTemplateFiles(r.Context(), templateID, hash, r.Body); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusCreated)
}
