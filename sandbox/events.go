package sandbox

import (
	"sync"
	"time"
)

// The lifecycle events of a sandbox, named as E2B names them in its
// webhook payloads.
const (
	EventCreated = "sandbox.lifecycle.created"
	EventKilled  = "sandbox.lifecycle.killed"
	EventPaused  = "sandbox.lifecycle.paused"
	EventResumed = "sandbox.lifecycle.resumed"
	EventForked  = "sandbox.lifecycle.forked"
)

// Event is one lifecycle transition of a sandbox, published once its
// record is durable.
type Event struct {
	Type       string
	SandboxID  string
	TemplateID string
	Metadata   map[string]string
	Time       time.Time
	// StartedAt, VCPUs and MemoryMiB describe the sandbox's current run
	// (E2B's execution data on killed and paused events).
	StartedAt time.Time
	VCPUs     int
	MemoryMiB int
}

// Hub fans events out to subscribers. The zero value is ready.
type Hub struct {
	mu   sync.Mutex
	next int
	subs map[int]func(Event)
}

// Subscribe calls f for every event from now on, until the returned
// cancel is called. f runs on the goroutine that made the transition
// (holding the sandbox's operation lock), so it must only hand the event
// on (queue it), never block or call back into the node.
func (h *Hub) Subscribe(f func(Event)) (cancel func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.subs == nil {
		h.subs = map[int]func(Event){}
	}
	id := h.next
	h.next++
	h.subs[id] = f
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		delete(h.subs, id)
	}
}

// Publish sends ev to the subscribers (Time defaults to now).
func (h *Hub) Publish(ev Event) {
	if ev.Time.IsZero() {
		ev.Time = time.Now().UTC()
	}
	h.mu.Lock()
	subs := make([]func(Event), 0, len(h.subs))
	for _, f := range h.subs {
		subs = append(subs, f)
	}
	h.mu.Unlock()
	for _, f := range subs {
		f(ev)
	}
}

// TransitionEvent names the event a durable state change is, if any: a
// failed pause going back to running, or a failed resume back to paused,
// is none.
func TransitionEvent(from, to State) string {
	switch {
	case to == Killing && from != Killing:
		return EventKilled
	case from == Starting && to == Running:
		return EventCreated
	case from == Resuming && to == Running:
		return EventResumed
	case from == Pausing && to == Paused:
		return EventPaused
	}
	return ""
}

// Published reports a record change to the subscribers when it is a
// lifecycle transition (a Journal calls it once the record is durable).
func (h *Hub) Published(from State, rec Record) {
	if typ := TransitionEvent(from, rec.State); typ != "" {
		h.Publish(Event{Type: typ, SandboxID: rec.ID, TemplateID: rec.TemplateID, Metadata: rec.Metadata,
			StartedAt: rec.StartedAt, VCPUs: rec.VCPUs, MemoryMiB: rec.MemoryMiB})
	}
}
