package main

import (
	"context"
	"time"

	"github.com/agentenv/agentenv/orchestrator"
	"github.com/agentenv/agentenv/proxy"
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
func proxySandbox(rec orchestrator.Record) proxy.Sandbox {
	return proxy.Sandbox{
		Killing:         rec.State == orchestrator.Killing,
		Paused:          rec.State == orchestrator.Paused,
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
func proxyEvents(px streamCloser) func(orchestrator.Event) {
	return func(ev orchestrator.Event) {
		if ev.Type == orchestrator.EventKilled || ev.Type == orchestrator.EventPaused {
			px.Ended(ev.SandboxID, ev.Type)
		}
	}
}
