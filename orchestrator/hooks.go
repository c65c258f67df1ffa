package orchestrator

import (
	"context"
	"errors"
	"sync"

	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/template"
)

// Hooks are the points of the verbs where a part of the node outside the
// orchestrator joins a transition (the snapshot repository, package
// replica): before it, to make what it needs (an error fails the verb),
// or after it is durable. Events (events.go) only report; hooks take part.
// Every hook runs on the verb's goroutine, in registration order; a nil
// field is no hook.
type Hooks struct {
	// MissingSource runs when a create names a template or snapshot this
	// node does not know, before the create resolves its source (outside
	// refMu: it may fetch for long). ErrNotFound is no error.
	MissingSource func(ctx context.Context, id string) error
	// MissingSandbox runs when a connect names a sandbox this node does
	// not hold, before the connect looks it up again. A hook that brings
	// it registers it (Node.AdoptPaused). ErrNotFound is no error.
	MissingSandbox func(ctx context.Context, id string) error
	// Paused runs once a pause that kept the memory is durable, its VMM
	// gone and its flatten started (operation lock held).
	Paused func(ctx context.Context, rec sandbox.Record)
	// SnapshotStored runs once a snapshot's record is stored.
	SnapshotStored func(ctx context.Context, r snapshot.Record)
	// SnapshotDeleted runs once a snapshot's record and files are gone.
	SnapshotDeleted func(r snapshot.Record)
	// TemplateReady runs once a template serves here: a build finished, a
	// ready template loaded at start, or one brought from elsewhere.
	TemplateReady func(ctx context.Context, t *template.Template)
	// Removed runs once a sandbox left the registry (a kill, a failed
	// create, a dropped stale copy), before its directory and record go.
	Removed func(rec sandbox.Record)
	// LayerFailure says why reads of the layer ref (a memory layer a VM
	// maps, named by a repository URL) failed lately; nil: none did. Asked
	// when a VM ends unasked or a resume fails, to name the layer.
	LayerFailure func(ref string) error
}

// hookList holds the registered hooks. The zero value is ready.
type hookList struct {
	mu   sync.Mutex
	next int
	regs []hookReg
}

type hookReg struct {
	id int
	h  Hooks
}

// Hook registers h until the returned cancel is called.
func (o *Orchestrator) Hook(h Hooks) (cancel func()) {
	l := &o.hooks
	l.mu.Lock()
	defer l.mu.Unlock()
	id := l.next
	l.next++
	l.regs = append(l.regs, hookReg{id: id, h: h})
	return func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		for i, r := range l.regs {
			if r.id == id {
				l.regs = append(l.regs[:i:i], l.regs[i+1:]...)
				return
			}
		}
	}
}

// registered returns the hooks registered now, in order.
func (o *Orchestrator) registered() []Hooks {
	l := &o.hooks
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Hooks, len(l.regs))
	for i, r := range l.regs {
		out[i] = r.h
	}
	return out
}

// hasMissingHooks reports whether a before-hook may bring what a verb
// misses (a create's source, a connect's sandbox).
func (o *Orchestrator) hasMissingHooks() bool {
	for _, h := range o.registered() {
		if h.MissingSource != nil || h.MissingSandbox != nil {
			return true
		}
	}
	return false
}

// beforeMissing runs the before-hooks pick selects for id; a hook's
// ErrNotFound (it has none either) is no error.
func (o *Orchestrator) beforeMissing(ctx context.Context, id string, pick func(Hooks) func(context.Context, string) error) error {
	for _, h := range o.registered() {
		f := pick(h)
		if f == nil {
			continue
		}
		if err := f(ctx, id); err != nil && !errors.Is(err, ErrNotFound) {
			return err
		}
	}
	return nil
}

// beforeMissingSource runs the MissingSource hooks.
func (o *Orchestrator) beforeMissingSource(ctx context.Context, id string) error {
	return o.beforeMissing(ctx, id, func(h Hooks) func(context.Context, string) error { return h.MissingSource })
}

// beforeMissingSandbox runs the MissingSandbox hooks.
func (o *Orchestrator) beforeMissingSandbox(ctx context.Context, id string) error {
	return o.beforeMissing(ctx, id, func(h Hooks) func(context.Context, string) error { return h.MissingSandbox })
}

// afterPaused runs the Paused hooks.
func (o *Orchestrator) afterPaused(ctx context.Context, rec sandbox.Record) {
	for _, h := range o.registered() {
		if h.Paused != nil {
			h.Paused(ctx, rec)
		}
	}
}

// afterSnapshotStored runs the SnapshotStored hooks.
func (o *Orchestrator) afterSnapshotStored(ctx context.Context, r snapshot.Record) {
	for _, h := range o.registered() {
		if h.SnapshotStored != nil {
			h.SnapshotStored(ctx, r)
		}
	}
}

// afterSnapshotDeleted runs the SnapshotDeleted hooks.
func (o *Orchestrator) afterSnapshotDeleted(r snapshot.Record) {
	for _, h := range o.registered() {
		if h.SnapshotDeleted != nil {
			h.SnapshotDeleted(r)
		}
	}
}

// afterTemplateReady runs the TemplateReady hooks.
func (o *Orchestrator) afterTemplateReady(ctx context.Context, t *template.Template) {
	for _, h := range o.registered() {
		if h.TemplateReady != nil {
			h.TemplateReady(ctx, t)
		}
	}
}

// afterRemoved runs the Removed hooks.
func (o *Orchestrator) afterRemoved(rec sandbox.Record) {
	for _, h := range o.registered() {
		if h.Removed != nil {
			h.Removed(rec)
		}
	}
}
