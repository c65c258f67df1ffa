package api

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/template"
)

// Template tags (E2B's /templates/tags): names for a template's builds,
// kept with the template's attributes. A template's build tags given at
// creation name its build. A tag names a build; creating a sandbox from
// "name:tag" is not supported (a node runs a template's latest build).

// tagRec is one tag's build and when it was assigned.
type tagRec struct {
	BuildID   string    `json:"buildID"`
	CreatedAt time.Time `json:"createdAt"`
}

const maxTagLen = 128

// latestBuild is the template's current build id.
func latestBuild(t template.Template) string {
	if t.BuildID != "" {
		return t.BuildID
	}
	if br := t.Builds[t.LatestBuild]; br != nil {
		return br.ID
	}
	return t.ID
}

// tags returns a template's tags: the stored ones over those it was
// created with.
func (s *Server) tags(t template.Template) map[string]tagRec {
	out := map[string]tagRec{}
	for _, tag := range t.Tags {
		out[tag] = tagRec{BuildID: latestBuild(t), CreatedAt: t.CreatedAt}
	}
	for tag, rec := range s.attrs.get(t.ID).Tags {
		if rec.BuildID == "" { // removed
			delete(out, tag)
			continue
		}
		out[tag] = rec
	}
	return out
}

func validTag(tag string) bool {
	return tag != "" && len(tag) <= maxTagLen && !strings.ContainsAny(tag, ": /\\\n\r\t")
}

// AssignTemplateTags implements ServerInterface.
func (s *Server) AssignTemplateTags(w http.ResponseWriter, r *http.Request) {
	var req wire.AssignTemplateTagsRequest
	if !decode(w, r, &req, true) {
		return
	}
	if len(req.Tags) == 0 || len(req.Tags) > 100 {
		writeError(w, http.StatusBadRequest, "tags must name 1..100 tags")
		return
	}
	for _, tag := range req.Tags {
		if !validTag(tag) {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("tag %q is not a tag (1..%d characters, no ':', '/' or spaces)", tag, maxTagLen))
			return
		}
	}
	name, from, _ := strings.Cut(req.Target, ":")
	t, err := s.o.ResolveTemplate(name)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	build := latestBuild(t)
	if from != "" {
		rec, ok := s.tags(t)[from]
		if !ok {
			writeError(w, http.StatusNotFound, fmt.Sprintf("template %s has no tag %q", name, from))
			return
		}
		build = rec.BuildID
	}
	now := time.Now().UTC()
	err = s.attrs.update(t.ID, func(a *templateAttrs) {
		if a.Tags == nil {
			a.Tags = map[string]tagRec{}
		}
		for _, tag := range req.Tags {
			a.Tags[tag] = tagRec{BuildID: build, CreatedAt: now}
		}
	})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, wire.AssignedTemplateTags{Tags: req.Tags, BuildID: build})
}

// DeleteTemplateTags implements ServerInterface: 404 for a tag the
// template does not have.
func (s *Server) DeleteTemplateTags(w http.ResponseWriter, r *http.Request) {
	var req wire.DeleteTemplateTagsRequest
	if !decode(w, r, &req, true) {
		return
	}
	t, err := s.o.ResolveTemplate(req.Name)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	have := s.tags(t)
	for _, tag := range req.Tags {
		if _, ok := have[tag]; !ok {
			writeError(w, http.StatusNotFound, fmt.Sprintf("template %s has no tag %q", req.Name, tag))
			return
		}
	}
	err = s.attrs.update(t.ID, func(a *templateAttrs) {
		if a.Tags == nil {
			a.Tags = map[string]tagRec{}
		}
		for _, tag := range req.Tags {
			a.Tags[tag] = tagRec{} // a tombstone: also hides a creation tag
		}
	})
	if err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// GetTemplateTags implements ServerInterface.
func (s *Server) GetTemplateTags(w http.ResponseWriter, r *http.Request, templateID string) {
	t, err := s.o.ResolveTemplate(templateID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := []wire.TemplateTag{}
	for tag, rec := range s.tags(t) {
		out = append(out, wire.TemplateTag{Tag: tag, BuildID: rec.BuildID, CreatedAt: rec.CreatedAt})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tag < out[j].Tag })
	writeJSON(w, http.StatusOK, out)
}
