package api

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"sync"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/template"

	"github.com/agentenv/agentenv/store"
)

// templateAttrs are what the API stores of a template beyond the
// orchestrator's record: E2B's public flag and tags (tags.go).
type templateAttrs struct {
	Public *bool             `json:"public,omitempty"`
	Tags   map[string]tagRec `json:"tags,omitempty"`
}

// attrStore keeps templateAttrs in the node's store (Options.Store), or in
// memory for a handler without one (tests of other routes).
type attrStore struct {
	st  *store.Store
	mu  sync.Mutex
	mem map[string]templateAttrs
}

func (a *attrStore) get(id string) templateAttrs {
	a.mu.Lock()
	defer a.mu.Unlock()
	var at templateAttrs
	if a.st == nil {
		at = a.mem[id]
		at.Tags = maps.Clone(at.Tags) // the caller reads it without the lock
		return at
	}
	if err := a.st.Get(store.TemplateAttrs, id, &at); err != nil {
		return templateAttrs{}
	}
	return at
}

func (a *attrStore) update(id string, f func(*templateAttrs)) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var at templateAttrs
	if a.st == nil {
		if a.mem == nil {
			a.mem = map[string]templateAttrs{}
		}
		at = a.mem[id]
		f(&at)
		a.mem[id] = at
		return nil
	}
	if err := a.st.Get(store.TemplateAttrs, id, &at); err != nil && !errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("read attributes of template %s: %w", id, err)
	}
	f(&at)
	if err := a.st.Put(store.TemplateAttrs, id, at); err != nil {
		return fmt.Errorf("store attributes of template %s: %w", id, err)
	}
	return nil
}

// public is whether template id is public: the stored flag, else true
// for the node's default template only.
func (s *Server) public(id string) bool {
	if p := s.attrs.get(id).Public; p != nil {
		return *p
	}
	return id == template.DefaultID
}

// UpdateTemplate implements ServerInterface (E2B's PATCH /templates/{id}):
// it stores public and answers the template's names.
func (s *Server) UpdateTemplate(w http.ResponseWriter, r *http.Request, templateID string) {
	var req wire.TemplateUpdateRequest
	if !decode(w, r, &req, true) {
		return
	}
	t, err := s.o.ResolveTemplate(templateID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if req.Public != nil {
		if err := s.attrs.update(t.ID, func(a *templateAttrs) { a.Public = req.Public }); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	names := t.Names
	if len(names) == 0 {
		names = []string{t.ID}
	}
	writeJSON(w, http.StatusOK, wire.TemplateUpdateResponse{Names: names})
}
