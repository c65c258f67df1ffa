package lifecycle

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/agentenv/agentenv/disk"
	"github.com/agentenv/agentenv/disk/disktest"
	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/store"
	"github.com/agentenv/agentenv/vmm"
)

// machine stands in for a VMM process (no VM boots in a unit test): it
// records the calls a verb makes and writes a snapshot file when asked.
type machine struct {
	mu                             sync.Mutex
	paused, resumed, stopped, snap int
}

func (m *machine) Pause(context.Context) error  { m.mu.Lock(); m.paused++; m.mu.Unlock(); return nil }
func (m *machine) Resume(context.Context) error { m.mu.Lock(); m.resumed++; m.mu.Unlock(); return nil }
func (m *machine) Stop(context.Context) error   { m.mu.Lock(); m.stopped++; m.mu.Unlock(); return nil }
func (m *machine) Wait(context.Context) error   { return nil }
func (m *machine) Info() vmm.Info               { return vmm.Info{Driver: "test"} }
func (m *machine) Snapshot(_ context.Context, dir string) (*vmm.Snapshot, error) {
	m.mu.Lock()
	m.snap++
	m.mu.Unlock()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	return &vmm.Snapshot{}, os.WriteFile(filepath.Join(dir, "state"), []byte("vm"), 0o600)
}

// serving is a serving sandbox for the verbs: its record written through
// a journal, its VM a machine.
type serving struct {
	rec     sandbox.Record
	m       *machine
	j       *sandbox.Journal
	stopped bool
}

func (s *serving) Record() sandbox.Record { return s.rec }
func (s *serving) Machine() vmm.Machine   { return s.m }
func (s *serving) Slot() *network.Slot    { return nil }
func (s *serving) Adopted() bool          { return false }
func (s *serving) Transition(to sandbox.State, change func(*sandbox.Record)) error {
	return s.j.Transition(s.rec, to, change, func(n sandbox.Record) { s.rec = n })
}
func (s *serving) Update(change func(*sandbox.Record)) error {
	next := s.rec
	change(&next)
	if err := s.j.Put(next); err != nil {
		return err
	}
	s.rec = next
	return nil
}
func (s *serving) Set(change func(*sandbox.Record))   { change(&s.rec) }
func (s *serving) StopVM(context.Context)             { s.stopped = true }
func (s *serving) ReleaseDevices(ctx context.Context) { s.rec.ClearDevices() }

// setup returns verbs on a temporary store and the in-process storage
// daemon, and a running sandbox's record written to the store.
func setup(t *testing.T) (*Verbs, *sandbox.Journal, sandbox.Record) {
	t.Helper()
	st, err := store.Open(filepath.Join(t.TempDir(), "state.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	disks, err := disk.Open(disktest.Devices(t), slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	j := &sandbox.Journal{Store: st, Log: slog.Default()}
	dir := filepath.Join(t.TempDir(), "sb")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	rec := sandbox.Record{ID: "sb1", State: sandbox.Running, Dir: dir, Gen: 1}
	if err := st.Put(store.Sandboxes, rec.ID, rec); err != nil {
		t.Fatal(err)
	}
	return &Verbs{Disks: disks, Store: st, Log: slog.Default(), DataDir: t.TempDir()}, j, rec
}

func stored(t *testing.T, st *store.Store, id string) sandbox.Record {
	t.Helper()
	var r sandbox.Record
	if err := st.Get(store.Sandboxes, id, &r); err != nil {
		t.Fatalf("record of %s: %v", id, err)
	}
	return r
}

// TestPauseFailureKeepsVMRunning: a pause whose seal fails (the record names no
// device) runs the undo stack: the VM continues, the record says running
// again, and no snapshot is left.
func TestPauseFailureKeepsVMRunning(t *testing.T) {
	v, j, rec := setup(t)
	s := &serving{rec: rec, m: &machine{}, j: j}
	_, err := v.Pause(context.Background(), s, false)
	if err == nil || !strings.Contains(err.Error(), "no device") {
		t.Fatalf("Pause = %v; want the seal's failure", err)
	}
	if got := stored(t, v.Store, rec.ID); got.State != sandbox.Running || got.FilesystemOnly {
		t.Fatalf("stored record after a failed pause: state %s, filesystemOnly %v; want running", got.State, got.FilesystemOnly)
	}
	if s.m.paused != 1 || s.m.resumed != 1 || s.stopped {
		t.Fatalf("machine paused %d, resumed %d, stopped %v; want the VM continued", s.m.paused, s.m.resumed, s.stopped)
	}
	if _, err := os.Stat(filepath.Join(rec.Dir, "snapshot-1")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a failed pause left its snapshot (stat: %v)", err)
	}
}

// TestPauseOfAdoptedFailureRecordsNothing: the same failure on a VM
// recovery adopted neither continues the VM nor records anything: its
// record stays as the crash left it.
func TestPauseOfAdoptedFailureRecordsNothing(t *testing.T) {
	v, _, rec := setup(t)
	m := &machine{}
	j := &sandbox.Journal{Store: v.Store, Log: slog.Default(), Recovery: true}
	a := Adopted(rec, m, j, v.Disks, slog.Default())
	if _, err := v.Pause(context.Background(), a, false); err == nil || !strings.Contains(err.Error(), "pause adopted machine") {
		t.Fatalf("Pause = %v; want the adopted pause's failure", err)
	}
	if got := stored(t, v.Store, rec.ID); got.State != sandbox.Running {
		t.Fatalf("stored state %s after a failed adopted pause; want running as left", got.State)
	}
	if m.resumed != 0 {
		t.Fatalf("an adopted VM was resumed %d times; recovery stops it", m.resumed)
	}
}

// TestKillRemovesEverything: a kill records "killing", stops the VM,
// hands the volumes back, forgets the sandbox and removes its directory
// and record, in that order.
func TestKillRemovesEverything(t *testing.T) {
	v, j, rec := setup(t)
	var killing bool
	j.Publish = func(_ sandbox.State, r sandbox.Record) { killing = killing || r.State == sandbox.Killing }
	s := &serving{rec: rec, m: &machine{}, j: j}
	var order []string
	how := Removal{
		Volumes: func(context.Context, sandbox.Record) { order = append(order, "volumes") },
		Forget:  func(sandbox.Record) { order = append(order, "forget") },
	}
	if err := v.Kill(context.Background(), s, how); err != nil {
		t.Fatal(err)
	}
	if !killing || !s.stopped || strings.Join(order, ",") != "volumes,forget" {
		t.Fatalf("killing published %v, VM stopped %v, hooks %v", killing, s.stopped, order)
	}
	if _, err := os.Stat(rec.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the sandbox's directory survived the kill (stat: %v)", err)
	}
	var r sandbox.Record
	if err := v.Store.Get(store.Sandboxes, rec.ID, &r); err == nil {
		t.Fatalf("the record survived the kill: %+v", r)
	}
}
