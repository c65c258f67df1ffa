package orchestrator

import "github.com/agentenv/agentenv/sandbox"

// Subscribe calls f for every lifecycle event from now on, until the
// returned cancel is called. f runs on the goroutine that made the
// transition (holding the sandbox's operation lock), so it must only hand
// the event on (queue it), never block or call back into the orchestrator.
func (o *Orchestrator) Subscribe(f func(sandbox.Event)) (cancel func()) { return o.events.Subscribe(f) }

// Publish sends ev to the subscribers (Time defaults to now). The API
// publishes what the orchestrator cannot see as one transition (a fork).
func (o *Orchestrator) Publish(ev sandbox.Event) { o.events.Publish(ev) }
