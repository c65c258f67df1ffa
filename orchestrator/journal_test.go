package orchestrator

import (
	"errors"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/store"
)

var allStates = []State{"", Starting, Running, Pausing, Paused, Resuming, Killing}

// legalPairs is the lifecycle written out by hand, independently of the
// table: a change of the table shows here.
var legalPairs = map[[2]State]bool{
	{"", Starting}: true, {"", Paused}: true,
	{Starting, Running}: true, {Starting, Killing}: true,
	{Running, Pausing}: true, {Running, Paused}: true, {Running, Killing}: true,
	{Pausing, Paused}: true, {Pausing, Running}: true, {Pausing, Killing}: true,
	{Paused, Resuming}: true, {Paused, Killing}: true,
	{Resuming, Running}: true, {Resuming, Paused}: true, {Resuming, Killing}: true,
}

func testJournal(t *testing.T) (*journal, *[]string) {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	var events []string
	j := &journal{store: st, log: slog.Default(), publish: func(from State, rec Record) {
		events = append(events, string(from)+">"+string(rec.State))
	}}
	return j, &events
}

// TestTransitionTable: every pair of states is either legal (persisted,
// handed to the holder, published) or refused with ErrIllegalTransition
// and nothing written.
func TestTransitionTable(t *testing.T) {
	for _, from := range allStates {
		for _, to := range allStates {
			legal := legalPairs[[2]State{from, to}]
			if got := Legal(from, to); got != legal {
				t.Errorf("Legal(%q, %q) = %v, want %v", from, to, got, legal)
			}
			j, events := testJournal(t)
			rec := Record{ID: "sb", State: from, VCPUs: 1}
			if from != "" {
				if err := j.store.Put(store.Sandboxes, rec.ID, rec); err != nil {
					t.Fatal(err)
				}
			}
			var held Record
			err := j.transition(rec, to, func(r *Record) { r.VCPUs = 2 }, func(r Record) { held = r })
			var stored Record
			gerr := j.store.Get(store.Sandboxes, rec.ID, &stored)
			if !legal {
				if !errors.Is(err, ErrIllegalTransition) {
					t.Errorf("%q -> %q: err %v, want ErrIllegalTransition", from, to, err)
				}
				if from == "" && gerr == nil || from != "" && (stored.State != from || stored.VCPUs != 1) {
					t.Errorf("%q -> %q refused but the store holds %+v (err %v)", from, to, stored, gerr)
				}
				if held.ID != "" || len(*events) != 0 {
					t.Errorf("%q -> %q refused but handed %+v, published %v", from, to, held, *events)
				}
				continue
			}
			if err != nil {
				t.Errorf("%q -> %q: %v", from, to, err)
				continue
			}
			if gerr != nil || stored.State != to || stored.VCPUs != 2 || held.State != to || held.VCPUs != 2 {
				t.Errorf("%q -> %q: stored %+v (%v), held %+v", from, to, stored, gerr, held)
			}
			if len(*events) != 1 || (*events)[0] != string(from)+">"+string(to) {
				t.Errorf("%q -> %q: published %v", from, to, *events)
			}
		}
	}
}

// TestStateHasOneWriter: a change function cannot set the state, and a
// plain write cannot change it or create a record.
func TestStateHasOneWriter(t *testing.T) {
	j, _ := testJournal(t)
	rec := Record{ID: "sb", State: Running}
	if err := j.put(rec); err == nil {
		t.Fatal("put created a record without a transition")
	}
	if err := j.store.Put(store.Sandboxes, rec.ID, rec); err != nil {
		t.Fatal(err)
	}
	err := j.transition(rec, Pausing, func(r *Record) { r.State = Killing }, nil)
	if !errors.Is(err, ErrIllegalTransition) {
		t.Fatalf("a change that sets the state itself: %v", err)
	}
	rec.State = Paused
	if err := j.put(rec); !errors.Is(err, ErrIllegalTransition) {
		t.Fatalf("a plain write changing the state: %v", err)
	}
	var stored Record
	if err := j.store.Get(store.Sandboxes, "sb", &stored); err != nil || stored.State != Running {
		t.Fatalf("stored %+v (%v), want running", stored, err)
	}
	rec.State, rec.VCPUs = Running, 4
	if err := j.put(rec); err != nil {
		t.Fatalf("a plain write of other fields: %v", err)
	}
}
