package lifecycle

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/disk"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/store"
)

// withDisk gives rec a root disk on the in-process storage daemon: a device
// stacked on a blank base layer, as a running sandbox holds one.
func withDisk(t *testing.T, v *Verbs, rec sandbox.Record) sandbox.Record {
	t.Helper()
	base := filepath.Join(t.TempDir(), "base")
	if err := disk.BlankLayer(context.Background(), base, 1<<20); err != nil {
		t.Fatal(err)
	}
	_, dev, err := v.Disks.Attach(context.Background(), rec.ID, base+".json", nil)
	if err != nil {
		t.Fatal(err)
	}
	rec.RootfsImage, rec.Device, rec.HasDevice = base+".json", dev, true
	rec.Memory = snapshot.MemoryImage{File: "/nonexistent/memory"}
	if err := v.Store.Put(store.Sandboxes, rec.ID, rec); err != nil {
		t.Fatal(err)
	}
	return rec
}

// TestPauseExitedKeepsDisk: a running sandbox whose VMM ended is paused
// without memory: its disk's upper sealed into a layer its record names,
// the reason recorded, the VM's handle and the device gone.
func TestPauseExitedKeepsDisk(t *testing.T) {
	v, j, rec := setup(t)
	rec = withDisk(t, v, rec)
	s := &serving{rec: rec, m: &machine{}, j: j}
	if err := v.PauseExited(context.Background(), s, "the VMM exited: signal: killed"); err != nil {
		t.Fatal(err)
	}
	got := stored(t, v.Store, rec.ID)
	if got.State != sandbox.Paused || !got.FilesystemOnly || got.Failure != "the VMM exited: signal: killed" {
		t.Fatalf("record after PauseExited: state %s, filesystemOnly %v, failure %q", got.State, got.FilesystemOnly, got.Failure)
	}
	if got.RootfsImage == rec.RootfsImage || len(snapshot.Refs(got.RootfsImage)) != 2 {
		t.Fatalf("record names disk %s (%v); want a sealed config of the base and the sandbox's layer", got.RootfsImage, snapshot.Refs(got.RootfsImage))
	}
	if got.HasDevice || got.Memory.File != "" || !s.stopped || s.m.paused != 0 {
		t.Fatalf("after PauseExited: device %v, memory %+v, VM handle stopped %v, vCPUs paused %d times", got.HasDevice, got.Memory, s.stopped, s.m.paused)
	}
}

// TestPauseExitedFinishesForRecovery: recovery finds a sandbox pausing
// with its VMM gone (no VMM adopted): PauseExited finishes it as a
// filesystem-only pause; and one whose disk cannot be sealed stays pausing
// with the reason, for the next start.
func TestPauseExitedFinishesForRecovery(t *testing.T) {
	v, _, rec := setup(t)
	rec.State = sandbox.Pausing
	rec = withDisk(t, v, rec)
	j := &sandbox.Journal{Store: v.Store, Log: slog.Default(), Recovery: true}
	if err := v.PauseExited(context.Background(), Adopted(rec, nil, j, v.Disks, slog.Default()), "gone at the start"); err != nil {
		t.Fatal(err)
	}
	if got := stored(t, v.Store, rec.ID); got.State != sandbox.Paused || !got.FilesystemOnly || got.Failure != "gone at the start" || got.HasDevice {
		t.Fatalf("recovered record: %+v", got)
	}

	_, j2, broken := setup(t)
	s := &serving{rec: broken, m: &machine{}, j: j2}
	err := v.PauseExited(context.Background(), s, "the VMM exited")
	if err == nil || !strings.Contains(err.Error(), "keep the disks") {
		t.Fatalf("PauseExited of a sandbox without a device = %v; want the seal's failure", err)
	}
	if got := stored(t, j2.Store, broken.ID); got.State != sandbox.Pausing || got.Failure != "the VMM exited" {
		t.Fatalf("record after a failed PauseExited: state %s, failure %q; want pausing with the reason (recovery finishes it)", got.State, got.Failure)
	}
}
