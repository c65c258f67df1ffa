package lifecycle

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/store"
)

// TestResumeFailureLeavesPaused: a bring-up that fails after recording a
// VMM leaves the sandbox paused on its snapshot, naming no VMM; one that
// succeeds records it running until now+timeout, from the snapshot unless
// memory is false (a cold boot, from no snapshot).
func TestResumeFailureLeavesPaused(t *testing.T) {
	v, j, rec := setup(t)
	rec.State, rec.Snapshot = sandbox.Paused, rec.Dir+"/snapshot-1"
	if err := v.Store.Put(store.Sandboxes, rec.ID, rec); err != nil {
		t.Fatal(err)
	}
	s := &serving{rec: rec, m: &machine{}, j: j}
	boom := errors.New("restore failed")
	var from []string
	failing := func(_ context.Context, f string, _ func(string)) error {
		from = append(from, f)
		return errors.Join(s.Update(func(r *sandbox.Record) { r.PID, r.PIDStart = 42, 7 }), boom)
	}
	flattenStopped := 0
	err := v.Resume(context.Background(), s, true, time.Minute, func() { flattenStopped++ }, failing)
	if !errors.Is(err, boom) {
		t.Fatalf("Resume = %v; want the bring-up's error", err)
	}
	got := stored(t, v.Store, rec.ID)
	if got.State != sandbox.Paused || got.PID != 0 || got.Snapshot != rec.Snapshot {
		t.Fatalf("after a failed resume: state %s, pid %d, snapshot %q; want paused on %q with no VMM", got.State, got.PID, got.Snapshot, rec.Snapshot)
	}
	ok := func(_ context.Context, f string, _ func(string)) error { from = append(from, f); return nil }
	if err := v.Resume(context.Background(), s, false, time.Minute, nil, ok); err != nil {
		t.Fatal(err)
	}
	got = stored(t, v.Store, rec.ID)
	if got.State != sandbox.Running || !got.ColdBoot || !got.EndAt.After(time.Now()) {
		t.Fatalf("after a cold resume: state %s, coldBoot %v, end %v; want running, cold, ending later", got.State, got.ColdBoot, got.EndAt)
	}
	if len(from) != 2 || from[0] != rec.Snapshot || from[1] != "" || flattenStopped != 1 {
		t.Fatalf("brought up from %q, flatten stopped %d times; want [%q \"\"], once", from, flattenStopped, rec.Snapshot)
	}
}
