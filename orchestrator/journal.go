package orchestrator

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/store"
)

// ErrIllegalTransition is returned for a state change the lifecycle table
// (edges) does not allow; nothing was written.
var ErrIllegalTransition = errors.New("illegal sandbox state transition")

// edge is one legal state change: the fault point fired once it is durable
// (nil: none), and whether the change is its verb's commit point, after
// which only cleanup follows (an injected error there is logged, not the
// verb's failure: nothing could undo what is durable).
type edge struct {
	point  *failpoint.Point
	commit bool
}

// edges is the table of legal transitions of a sandbox's state. The empty
// state is a record not yet written: a create starts it, an import from the
// repository brings it paused. Killing is final: the record is deleted
// next (a kill, a rolled-back create, a dropped stale copy).
var edges = map[State]map[State]edge{
	"":       {Starting: {point: fpCreateRecorded}, Paused: {}},
	Starting: {Running: {point: fpCreateRunning}, Killing: {point: fpKillRecorded}},
	Running:  {Pausing: {point: fpPauseRecorded}, Paused: {}, Killing: {point: fpKillRecorded}},
	Pausing:  {Paused: {point: fpPausePaused, commit: true}, Running: {}, Killing: {point: fpKillRecorded}},
	Paused:   {Resuming: {point: fpResumeRecorded}, Killing: {point: fpKillRecorded}},
	Resuming: {Running: {}, Paused: {}, Killing: {point: fpKillRecorded}},
	Killing:  {},
}

// Legal reports whether a sandbox may go from state from to state to.
func Legal(from, to State) bool {
	_, ok := edges[from][to]
	return ok
}

// journal is the one writer of sandbox records: a state changes only
// through transition, which checks the table, persists the record, hands
// it to its holder, publishes the lifecycle event and fires the fault
// point; put writes the other fields and refuses a state change.
type journal struct {
	store   *store.Store
	publish func(from State, rec Record) // nil: no events
	log     *slog.Logger
	// recovery marks the journal of startup recovery, which finishes what
	// a crash at a fault point interrupted: it fires none itself.
	recovery bool
}

// transition moves rec to state to with change applied (change may be
// nil; it must not set State). set (nil: none) receives the durable record
// before the event goes out, so the holder's copy is never older than
// what subscribers saw. On an error before the record is durable nothing
// changed; an error of the fault point comes after it.
func (j *journal) transition(rec Record, to State, change func(*Record), set func(Record)) error {
	e, err := legalEdge(rec, to)
	if err != nil {
		return err
	}
	return j.write(rec, to, change, set, e, true)
}

// quietly is transition without the lifecycle event and with fault point
// p instead of the table's: a change nobody outside the node should hear
// of (a stale copy dropped while the sandbox lives on elsewhere).
func (j *journal) quietly(rec Record, to State, set func(Record), p *failpoint.Point) error {
	e, err := legalEdge(rec, to)
	if err != nil {
		return err
	}
	e.point = p
	return j.write(rec, to, nil, set, e, false)
}

func legalEdge(rec Record, to State) (edge, error) {
	e, ok := edges[rec.State][to]
	if !ok {
		return e, fmt.Errorf("sandbox %s: %s -> %s: %w", rec.ID, stateName(rec.State), to, ErrIllegalTransition)
	}
	return e, nil
}

func (j *journal) write(rec Record, to State, change func(*Record), set func(Record), e edge, publish bool) error {
	from := rec.State
	next := rec
	if change != nil {
		change(&next)
	}
	if next.State != from {
		return fmt.Errorf("sandbox %s: a change of %s -> %s set the state itself: %w", rec.ID, stateName(from), to, ErrIllegalTransition)
	}
	next.State = to
	if err := j.store.Put(store.Sandboxes, next.ID, next); err != nil {
		return fmt.Errorf("record sandbox %s (%s): %w", next.ID, to, err)
	}
	if set != nil {
		set(next)
	}
	if publish && j.publish != nil {
		j.publish(from, next)
	}
	if e.point == nil || j.recovery {
		return nil
	}
	err := e.point.Inject()
	if err != nil && e.commit {
		j.log.Warn("fault point after a commit point ignored", "sandbox", next.ID, "state", to, "err", err)
		return nil
	}
	return err
}

// put persists rec's other fields: the record exists and its state is the
// one stored (a new record and a new state come through transition).
func (j *journal) put(rec Record) error {
	var old Record
	if err := j.store.Get(store.Sandboxes, rec.ID, &old); err != nil {
		return fmt.Errorf("record sandbox %s: %w", rec.ID, err)
	}
	if old.State != rec.State {
		return fmt.Errorf("sandbox %s: a plain write would change %s -> %s: %w", rec.ID, old.State, rec.State, ErrIllegalTransition)
	}
	if err := j.store.Put(store.Sandboxes, rec.ID, rec); err != nil {
		return fmt.Errorf("record sandbox %s (%s): %w", rec.ID, rec.State, err)
	}
	return nil
}

func stateName(s State) string {
	if s == "" {
		return "(new)"
	}
	return string(s)
}
