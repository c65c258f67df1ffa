package main

import (
	"context"
	"time"

	"github.com/agentenv/agentenv/orchestrator"
	"github.com/agentenv/agentenv/proxy"
	"github.com/agentenv/agentenv/sandbox"
)

// proxySandboxes shows the orchestrator's sandboxes to the proxy as the
// little it needs (proxy.Sandboxes), so the proxy links no node package.
type proxySandboxes struct{ o *orchestrator.Orchestrator }

// Get implements proxy.Sandboxes.
func (s proxySandboxes) Get(id string) (proxy.Sandbox, error) {
	rec, err := s.o.Get(id)
	if err != nil {
		return proxy.Sandbox{}, err
	}
	return proxySandbox(rec), nil
}

// proxySandbox is what the proxy knows of rec.
func proxySandbox(rec sandbox.Record) proxy.Sandbox {
	return proxy.Sandbox{
		Killing:         rec.State == sandbox.Killing,
		Paused:          rec.State == sandbox.Paused,
		AutoResume:      rec.AutoResume,
		FilesystemOnly:  rec.FilesystemOnly,
		TrafficToken:    rec.TrafficToken,
		MaskRequestHost: rec.MaskRequestHost,
		AccessToken:     rec.AccessToken,
		Secure:          rec.Secure,
	}
}

// Slot implements proxy.Sandboxes: the running sandbox's network slot.
func (s proxySandboxes) Slot(id string) (proxy.Guest, int, error) {
	slot, gen, err := s.o.Slot(id)
	if err != nil {
		return nil, 0, err // never a typed nil in the interface
	}
	return slot, gen, nil
}

// Connect implements proxy.Sandboxes.
func (s proxySandboxes) Connect(ctx context.Context, id string, timeout time.Duration, memory bool) error {
	_, _, err := s.o.Connect(ctx, id, timeout, memory)
	return err
}

// streamCloser is the part of the proxy that ends a sandbox's streams.
type streamCloser interface{ Ended(id, event string) }

// proxyEvents passes the orchestrator's lifecycle events on to the proxy:
// a killed or paused sandbox's upstream connections are closed.
func proxyEvents(px streamCloser) func(sandbox.Event) {
	return func(ev sandbox.Event) {
		if ev.Type == sandbox.EventKilled || ev.Type == sandbox.EventPaused {
			px.Ended(ev.SandboxID, ev.Type)
		}
	}
}

// IDs implements proxy.Lister: the node's sandboxes, for routing a signed
// /files URL that names none.
func (s proxySandboxes) IDs() []string {
	recs := s.o.List()
	ids := make([]string, 0, len(recs))
	for _, r := range recs {
		ids = append(ids, r.ID)
	}
	return ids
}
