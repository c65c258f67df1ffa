package recovery

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/disk/disktest"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/store"
	"github.com/agentenv/agentenv/vmm"
)

// noAdopt is a driver that cannot take machines over (no VM boots in a
// unit test): every record whose VMM would have to be adopted is settled
// without one.
type noAdopt struct{}

func (noAdopt) Name() string { return "none" }
func (noAdopt) Boot(context.Context, vmm.Config) (vmm.Machine, error) {
	return nil, vmm.ErrUnsupported
}
func (noAdopt) Restore(context.Context, vmm.RestoreConfig) (vmm.Machine, error) {
	return nil, vmm.ErrUnsupported
}

// TestRecoverSettlesEveryState: an interrupted create is rolled back and
// an interrupted kill finished (the kill verb: directory and record go),
// a running sandbox whose VMM cannot be adopted is dropped, an
// interrupted resume goes back to paused on its snapshot, and a paused
// sandbox is kept with the VMM a pause left forgotten.
func TestRecoverSettlesEveryState(t *testing.T) {
	dataDir := t.TempDir()
	st, err := store.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	put := func(id string, state sandbox.State, f func(*sandbox.Record)) sandbox.Record {
		r := sandbox.Record{ID: id, State: state, Dir: filepath.Join(dataDir, "sandboxes", id), Gen: 1}
		if f != nil {
			f(&r)
		}
		if err := os.MkdirAll(r.Dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := st.Put(store.Sandboxes, id, r); err != nil {
			t.Fatal(err)
		}
		return r
	}
	starting := put("starting", sandbox.Starting, nil)
	killing := put("killing", sandbox.Killing, nil)
	running := put("running", sandbox.Running, func(r *sandbox.Record) { r.Slot = 3 })
	resuming := put("resuming", sandbox.Resuming, func(r *sandbox.Record) { r.Snapshot = filepath.Join(r.Dir, "snapshot-0") })
	put("paused", sandbox.Paused, func(r *sandbox.Record) { r.PID, r.Snapshot = 0, filepath.Join(r.Dir, "snapshot-1") })

	rec, err := Recover(context.Background(), noAdopt{}, st, disktest.Devices(t), dataDir, slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Slots()) != 0 {
		t.Fatalf("recovered slots %v; no VM could be adopted", rec.Slots())
	}
	for _, gone := range []sandbox.Record{starting, killing, running} {
		var r sandbox.Record
		if err := st.Get(store.Sandboxes, gone.ID, &r); err == nil {
			t.Errorf("sandbox %s (%s) survived recovery as %s", gone.ID, gone.State, r.State)
		}
		if _, err := os.Stat(gone.Dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("sandbox %s (%s): its directory survived recovery (stat: %v)", gone.ID, gone.State, err)
		}
	}
	var r sandbox.Record
	if err := st.Get(store.Sandboxes, resuming.ID, &r); err != nil || r.State != sandbox.Paused || r.Snapshot != resuming.Snapshot {
		t.Errorf("interrupted resume: %+v, %v; want paused on its snapshot", r, err)
	}
	if err := st.Get(store.Sandboxes, "paused", &r); err != nil || r.State != sandbox.Paused {
		t.Errorf("paused sandbox: %+v, %v; want kept paused", r, err)
	}
}
