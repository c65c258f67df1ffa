package sandbox

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/network/nettest"
	"github.com/agentenv/agentenv/vmm"
)

// fakeMachine is a stand-in VMM without a process, named as a fake: what
// these tests check is the order of its Stop and the release of its memory
// image's hold, which a real VMM shows no better.
type fakeMachine struct {
	events  *[]string
	stopErr error
}

func (m *fakeMachine) Pause(context.Context) error { return nil }
func (m *fakeMachine) Resume(context.Context) error {
	*m.events = append(*m.events, "vcpus run")
	return nil
}
func (m *fakeMachine) Snapshot(context.Context, string) (*vmm.Snapshot, error) {
	return nil, vmm.ErrUnsupported
}
func (m *fakeMachine) Wait(context.Context) error { return nil }
func (m *fakeMachine) Info() vmm.Info             { return vmm.Info{} }
func (m *fakeMachine) Stop(context.Context) error {
	*m.events = append(*m.events, "vmm stopped")
	return m.stopErr
}

// fakeDriver restores its one fake machine.
type fakeDriver struct{ m *fakeMachine }

func (fakeDriver) Name() string { return "fake" }
func (fakeDriver) Boot(context.Context, vmm.Config) (vmm.Machine, error) {
	return nil, vmm.ErrUnsupported
}
func (d fakeDriver) Restore(_ context.Context, rc vmm.RestoreConfig) (vmm.Machine, error) {
	if rc.Paused {
		*d.m.events = append(*d.m.events, "state loaded, vcpus stopped")
	}
	return d.m, nil
}

// nopDisk is a disk with nothing behind it.
type nopDisk struct{}

func (nopDisk) Attach(context.Context, *vmm.Identity) (vmm.Drive, error) {
	return vmm.Drive{ID: "rootfs", Path: "/dev/null"}, nil
}
func (nopDisk) Detach(context.Context) {}

// testSlots is a network manager in a world of its own (root only).
func testSlots(t *testing.T) *network.Manager {
	t.Helper()
	nettest.RequireRoot(t)
	w := nettest.NewWorld(t, nettest.Prefix())
	nets, err := network.New(t.Context(), w.Config())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nets.Shutdown(context.Background()) })
	return nets
}

func recorder(events *[]string, name string) func(context.Context) {
	return func(context.Context) { *events = append(*events, name) }
}

// TestStopReleasesMemoryAfterVMM: a VM gives back its memory image's holds
// once its VMM is gone, all of them, once; a VMM that did not stop keeps
// them (it may still map the image).
func TestStopReleasesMemoryAfterVMM(t *testing.T) {
	var events []string
	v := Adopt(Deps{}, "vm", &fakeMachine{events: &events}, nil, nil, nil)
	v.HoldMemory(recorder(&events, "released a"))
	v.HoldMemory(nil)
	v.HoldMemory(recorder(&events, "released b"))
	if err := v.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	_ = v.Stop(context.Background())
	if want := []string{"vmm stopped", "released a", "released b"}; !slices.Equal(events, want) {
		t.Fatalf("events %q, want %q", events, want)
	}

	events = nil
	stuck := Adopt(Deps{}, "stuck", &fakeMachine{events: &events, stopErr: errors.New("still running")}, nil, nil, nil)
	stuck.HoldMemory(recorder(&events, "released"))
	if err := stuck.Stop(context.Background()); err == nil {
		t.Fatal("a failed VMM stop reported no error")
	}
	if want := []string{"vmm stopped"}; !slices.Equal(events, want) {
		t.Fatalf("events %q, want %q: a VMM that did not stop keeps its memory hold", events, want)
	}
}

// TestFailedStartReleasesMemoryAfterVMM: a start that fails after its VMM
// ran stops the VMM before it gives back the memory image's hold.
func TestFailedStartReleasesMemoryAfterVMM(t *testing.T) {
	nets := testSlots(t)
	var events []string
	_, err := Start(t.Context(), Deps{Driver: fakeDriver{&fakeMachine{events: &events}}, Slots: nets}, Spec{
		ID: "failing", RunDir: filepath.Join(t.TempDir(), "run"), Disk: nopDisk{}, Restore: "snapshot",
		Memory: func(context.Context) (Memory, error) {
			return Memory{File: "/dev/ublkb0", Release: recorder(&events, "released")}, nil
		},
		Started: func(vmm.Machine) error { return errors.New("started hook fails") },
	})
	if err == nil {
		t.Fatal("the start did not fail")
	}
	if want := []string{"vmm stopped", "released"}; !slices.Equal(events, want) {
		t.Fatalf("events %q, want %q", events, want)
	}
}

// TestGuestRunsOnceMemoryIsReady: a memory image with Ready (a working set
// being pushed) is restored with the vCPUs stopped, which run only after
// Ready returned; one without it is restored running.
func TestGuestRunsOnceMemoryIsReady(t *testing.T) {
	nets := testSlots(t)
	for _, ready := range []bool{true, false} {
		var events []string
		mem := Memory{File: "/dev/ublkb0"}
		if ready {
			mem.Ready = recorder(&events, "memory ready")
		}
		_, err := Start(t.Context(), Deps{Driver: fakeDriver{&fakeMachine{events: &events}}, Slots: nets}, Spec{
			ID: "held", RunDir: filepath.Join(t.TempDir(), "run"), Disk: nopDisk{}, Restore: "snapshot",
			Memory:  func(context.Context) (Memory, error) { return mem, nil },
			Started: func(vmm.Machine) error { return errors.New("stop here") },
		})
		if err == nil {
			t.Fatal("the start did not fail")
		}
		want := []string{"vmm stopped"}
		if ready {
			want = []string{"state loaded, vcpus stopped", "memory ready", "vcpus run", "vmm stopped"}
		}
		if !slices.Equal(events, want) {
			t.Fatalf("ready %v: events %q, want %q", ready, events, want)
		}
	}
}
