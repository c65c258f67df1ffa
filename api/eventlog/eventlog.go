// Package eventlog keeps the node's recent sandbox lifecycle events in
// memory, for GET /events/sandboxes (the node's feed) and GET
// /events/sandboxes/{id} (one sandbox's state history). It subscribes to
// the orchestrator's event bus; everything it holds is bounded: a ring of
// the node's last events, a ring per sandbox, and a number of sandboxes
// whose history is kept (the least recently active is forgotten first, so
// the history of a killed sandbox stays until newer ones push it out).
// Nothing survives a restart.
package eventlog

import (
	"container/list"
	"crypto/rand"
	"encoding/hex"
	"maps"
	"slices"
	"sync"

	"github.com/agentenv/agentenv/sandbox"
)

// Defaults of Limits.
const (
	DefaultRecent     = 1000
	DefaultPerSandbox = 100
	DefaultSandboxes  = 10000
)

// Limits bound what the log holds (zero values take the defaults).
type Limits struct {
	// Recent is how many of the node's last events the feed keeps.
	Recent int
	// PerSandbox is how many events of one sandbox are kept.
	PerSandbox int
	// Sandboxes is how many sandboxes have a history kept.
	Sandboxes int
}

// Entry is one recorded event with its id.
type Entry struct {
	ID string
	sandbox.Event
}

// Query selects and pages entries: newest first unless Asc; Types, when
// not empty, keeps only events of those types.
type Query struct {
	Offset, Limit int
	Asc           bool
	Types         []string
}

// ring is a fixed-capacity buffer in arrival order; it grows to its
// capacity as entries come.
type ring struct {
	buf   []Entry
	cap   int
	start int // the oldest entry once full
}

func (r *ring) push(e Entry) {
	if len(r.buf) < r.cap {
		r.buf = append(r.buf, e)
		return
	}
	r.buf[r.start] = e
	r.start = (r.start + 1) % r.cap
}

// all returns the entries oldest first.
func (r *ring) all() []Entry {
	out := make([]Entry, 0, len(r.buf))
	return append(append(out, r.buf[r.start:]...), r.buf[:r.start]...)
}

// history is one sandbox's ring, an element of the log's activity list.
type history struct {
	id   string
	ring ring
}

// Log holds the events. The zero value is not ready: use New.
type Log struct {
	lim Limits

	mu       sync.Mutex
	recent   ring
	sandbox  map[string]*list.Element // of *history
	activity *list.List               // front: the most recently active sandbox
}

// New returns an empty log bounded by lim.
func New(lim Limits) *Log {
	if lim.Recent <= 0 {
		lim.Recent = DefaultRecent
	}
	if lim.PerSandbox <= 0 {
		lim.PerSandbox = DefaultPerSandbox
	}
	if lim.Sandboxes <= 0 {
		lim.Sandboxes = DefaultSandboxes
	}
	return &Log{lim: lim, recent: ring{cap: lim.Recent}, sandbox: map[string]*list.Element{}, activity: list.New()}
}

// OnEvent records ev: an orchestrator subscriber, it only takes the log's
// lock and never blocks on anything else.
func (l *Log) OnEvent(ev sandbox.Event) {
	ev.Metadata = maps.Clone(ev.Metadata) // the log's own copy
	e := Entry{ID: newID(), Event: ev}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recent.push(e)
	el, ok := l.sandbox[ev.SandboxID]
	if ok {
		l.activity.MoveToFront(el)
	} else {
		el = l.activity.PushFront(&history{id: ev.SandboxID, ring: ring{cap: l.lim.PerSandbox}})
		l.sandbox[ev.SandboxID] = el
		for l.activity.Len() > l.lim.Sandboxes {
			oldest := l.activity.Back()
			l.activity.Remove(oldest)
			delete(l.sandbox, oldest.Value.(*history).id)
		}
	}
	el.Value.(*history).ring.push(e)
}

// Recent returns the node's last events selected by q.
func (l *Log) Recent(q Query) []Entry {
	l.mu.Lock()
	all := l.recent.all()
	l.mu.Unlock()
	return q.apply(all)
}

// Sandbox returns the events of sandbox id selected by q, and whether the
// log has any event of it.
func (l *Log) Sandbox(id string, q Query) ([]Entry, bool) {
	l.mu.Lock()
	el, ok := l.sandbox[id]
	var all []Entry
	if ok {
		all = el.Value.(*history).ring.all()
	}
	l.mu.Unlock()
	return q.apply(all), ok
}

// Len is how many sandboxes have a history kept.
func (l *Log) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.sandbox)
}

// apply filters, orders and pages entries given oldest first.
func (q Query) apply(all []Entry) []Entry {
	out := all[:0]
	for _, e := range all {
		if len(q.Types) == 0 || slices.Contains(q.Types, e.Type) {
			out = append(out, e)
		}
	}
	if !q.Asc {
		slices.Reverse(out)
	}
	if q.Offset >= len(out) {
		return []Entry{}
	}
	out = out[max(0, q.Offset):]
	if q.Limit > 0 && q.Limit < len(out) {
		out = out[:q.Limit]
	}
	return out
}

// newID is a random 128-bit id in hex.
func newID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
