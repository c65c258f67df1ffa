package api

import (
	"errors"
	"net/http"

	"github.com/agentenv/agentenv/api/webhooks"
	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/orchestrator"
)

// Lifecycle webhooks (E2B's /events/webhooks): registrations and
// deliveries are the webhooks package's; these handlers map its errors
// and shapes.

func webhookConfig(h webhooks.Webhook) wire.WebhookConfig {
	events := h.Events
	if events == nil {
		events = []string{}
	}
	return wire.WebhookConfig{Id: h.ID, TeamID: webhooks.TeamID, Name: h.Name, CreatedAt: h.CreatedAt, Enabled: h.Enabled, Url: h.URL, Events: events}
}

// webhooksOr answers 404 on a node without webhooks; the dispatcher else.
func (s *Server) webhooksOr(w http.ResponseWriter) *webhooks.Dispatcher {
	if s.opts.Webhooks == nil {
		writeError(w, http.StatusNotFound, "lifecycle webhooks are not enabled on this node")
	}
	return s.opts.Webhooks
}

func (s *Server) webhookFail(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, webhooks.ErrInvalid):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, webhooks.ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	default:
		s.fail(w, r, err)
	}
}

// ListWebhooks implements ServerInterface.
func (s *Server) ListWebhooks(w http.ResponseWriter, r *http.Request) {
	d := s.webhooksOr(w)
	if d == nil {
		return
	}
	out := []wire.WebhookConfig{}
	for _, h := range d.List() {
		out = append(out, webhookConfig(h))
	}
	writeJSON(w, http.StatusOK, out)
}

// CreateWebhook implements ServerInterface (enabled unless it says not).
func (s *Server) CreateWebhook(w http.ResponseWriter, r *http.Request) {
	d := s.webhooksOr(w)
	if d == nil {
		return
	}
	var req wire.WebhookCreate
	if !decode(w, r, &req, true) {
		return
	}
	enabled := true
	if req.Enabled != nil {
		enabled = *req.Enabled
	}
	h, err := d.Create(webhooks.Webhook{Name: deref(req.Name), URL: req.Url, Enabled: enabled, Events: req.Events, Secret: deref(req.SignatureSecret)})
	if err != nil {
		s.webhookFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, webhookConfig(h))
}

// GetWebhook implements ServerInterface.
func (s *Server) GetWebhook(w http.ResponseWriter, r *http.Request, webhookID string) {
	d := s.webhooksOr(w)
	if d == nil {
		return
	}
	h, err := d.Get(webhookID)
	if err != nil {
		s.webhookFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, webhookConfig(h))
}

// UpdateWebhook implements ServerInterface: the fields given replace the
// registration's.
func (s *Server) UpdateWebhook(w http.ResponseWriter, r *http.Request, webhookID string) {
	d := s.webhooksOr(w)
	if d == nil {
		return
	}
	var req wire.WebhookUpdate
	if !decode(w, r, &req, true) {
		return
	}
	h, err := d.Update(webhookID, webhooks.Patch{Name: req.Name, URL: req.Url, Enabled: req.Enabled, Events: req.Events, Secret: req.SignatureSecret})
	if err != nil {
		s.webhookFail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, webhookConfig(h))
}

// DeleteWebhook implements ServerInterface.
func (s *Server) DeleteWebhook(w http.ResponseWriter, r *http.Request, webhookID string) {
	d := s.webhooksOr(w)
	if d == nil {
		return
	}
	if err := d.Delete(webhookID); err != nil {
		s.webhookFail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// publishFork tells the subscribers a sandbox was forked: one transition
// of the source the orchestrator does not see as such.
func (s *Server) publishFork(rec orchestrator.Record) {
	s.o.Publish(orchestrator.Event{Type: orchestrator.EventForked, SandboxID: rec.ID, TemplateID: rec.TemplateID,
		Metadata: rec.Metadata, StartedAt: rec.StartedAt, VCPUs: rec.VCPUs, MemoryMiB: rec.MemoryMiB})
}
