package api

import (
	"fmt"
	"net/http"

	"github.com/agentenv/agentenv/api/eventlog"
	"github.com/agentenv/agentenv/api/webhooks"
	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/sandbox"
)

// Sandbox lifecycle events (E2B's /events/sandboxes) from the node's
// in-memory event log, and the recent attempts of a webhook's deliveries
// (an extension).

// maxEventLimit is the most events one call answers (E2B's limit).
const maxEventLimit = 100

// eventQuery checks the paging parameters (E2B's defaults: offset 0,
// limit 10, newest first).
func eventQuery(offset, limit *int32, asc *bool, types *[]string) (eventlog.Query, error) {
	q := eventlog.Query{Offset: int(deref(offset)), Limit: 10, Asc: deref(asc), Types: deref(types)}
	if limit != nil {
		q.Limit = int(*limit)
	}
	if q.Offset < 0 || q.Limit < 1 || q.Limit > maxEventLimit {
		return q, fmt.Errorf("bad paging offset=%d limit=%d: offset must be at least 0, limit 1..%d", q.Offset, q.Limit, maxEventLimit)
	}
	return q, nil
}

// eventsOr answers 404 on a node without an event log; the log else.
func (s *Server) eventsOr(w http.ResponseWriter) *eventlog.Log {
	if s.opts.Events == nil {
		writeError(w, http.StatusNotFound, "the sandbox event log is not enabled on this node")
	}
	return s.opts.Events
}

// ListSandboxEvents implements ServerInterface: the node's recent events.
func (s *Server) ListSandboxEvents(w http.ResponseWriter, r *http.Request, params wire.ListSandboxEventsParams) {
	l := s.eventsOr(w)
	if l == nil {
		return
	}
	q, err := eventQuery(params.Offset, params.Limit, params.OrderAsc, params.Types)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, sandboxEvents(l.Recent(q)))
}

// ListEventsOfSandbox implements ServerInterface: one sandbox's events,
// kept after it is gone; 404 for a sandbox the node neither holds nor has
// events of.
func (s *Server) ListEventsOfSandbox(w http.ResponseWriter, r *http.Request, sandboxID wire.SandboxID, params wire.ListEventsOfSandboxParams) {
	l := s.eventsOr(w)
	if l == nil {
		return
	}
	q, err := eventQuery(params.Offset, params.Limit, params.OrderAsc, params.Types)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	es, known := l.Sandbox(sandboxID, q)
	if !known {
		if _, err := s.o.Get(sandboxID); err != nil {
			s.fail(w, r, fmt.Errorf("events of sandbox %s: %w", sandboxID, err))
			return
		}
	}
	writeJSON(w, http.StatusOK, sandboxEvents(es))
}

// sandboxEvents maps log entries onto E2B's event format (as its webhook
// payloads: execution data on killed and paused events).
func sandboxEvents(es []eventlog.Entry) []wire.SandboxEvent {
	out := make([]wire.SandboxEvent, 0, len(es))
	for _, e := range es {
		ev := wire.SandboxEvent{Version: "v1", Id: e.ID, Type: e.Type, SandboxId: e.SandboxID, SandboxTemplateId: e.TemplateID,
			SandboxBuildId: e.TemplateID, SandboxTeamId: webhooks.TeamID, SandboxExecutionId: webhooks.ExecutionID(e.Event),
			Timestamp: e.Time.UTC()}
		data := wire.SandboxEventData{}
		if len(e.Metadata) > 0 {
			data.SandboxMetadata = &e.Metadata
		}
		if e.Type == sandbox.EventKilled || e.Type == sandbox.EventPaused {
			data.Execution = &wire.SandboxEventExecution{StartedAt: e.StartedAt.UTC(), VcpuCount: int32(e.VCPUs),
				MemoryMb: int32(e.MemoryMiB), ExecutionTime: max(0, e.Time.Sub(e.StartedAt).Milliseconds())}
		}
		if data.SandboxMetadata != nil || data.Execution != nil {
			ev.EventData = &data
		}
		out = append(out, ev)
	}
	return out
}

// ListWebhookDeliveries implements ServerInterface: the webhook's recent
// delivery attempts, newest first.
func (s *Server) ListWebhookDeliveries(w http.ResponseWriter, r *http.Request, webhookID string) {
	d := s.webhooksOr(w)
	if d == nil {
		return
	}
	as, err := d.Attempts(webhookID)
	if err != nil {
		s.webhookFail(w, r, err)
		return
	}
	out := make([]wire.WebhookDelivery, 0, len(as))
	for _, a := range as {
		wd := wire.WebhookDelivery{DeliveryID: a.DeliveryID, WebhookID: a.WebhookID, Event: a.Event, SandboxID: a.SandboxID,
			Timestamp: a.Time, Attempt: int32(a.Number), Outcome: wire.WebhookDeliveryOutcome(a.Outcome)}
		if a.StatusCode != 0 {
			wd.StatusCode = new(int32(a.StatusCode))
		}
		if a.Error != "" {
			wd.Error = new(a.Error)
		}
		out = append(out, wd)
	}
	writeJSON(w, http.StatusOK, out)
}
