package volume

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/internal/crashdisk"
	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/snapshot"
)

// TestCreatedVolumeSurvivesPowerLoss: once Create returns, a power loss
// leaves the volume's directory, record and base layer, so the store opened
// on what the disk kept lists the volume with its layers. A create stopped
// at volume/create/dir (the directory durable, nothing in it) leaves no
// volume once the store is opened again.
func TestCreatedVolumeSurvivesPowerLoss(t *testing.T) {
	d := crashdisk.New(t, 256)
	ctx := t.Context()
	s := open(t, filepath.Join(d.Root(), "volumes"))
	v, err := s.Create(ctx, "kept", 0)
	if err != nil {
		t.Fatal(err)
	}
	crashed := d.Crash()
	// The record names the live paths: check the copy's files first, then
	// that a store opened on the copy lists the volume.
	vdir := filepath.Join(crashed, "volumes", v.ID)
	layers, err := snapshot.LayersOf(filepath.Join(vdir, "base.json"))
	if err != nil || len(layers) != 1 {
		t.Fatalf("base layer config after a power loss: %v (%v)", layers, err)
	}
	if st, err := os.Stat(filepath.Join(vdir, filepath.Base(layers[0]))); err != nil || st.Size() == 0 {
		t.Fatalf("base layer after a power loss: %v", err)
	}
	got, err := open(t, filepath.Join(crashed, "volumes")).Get("kept")
	if err != nil || got.ID != v.ID {
		t.Fatalf("volume after a power loss: %+v (%v), want %s", got, err, v.ID)
	}

	if err := failpoint.Arm("volume/create/dir", "error"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { failpoint.Arm("volume/create/dir", "") })
	if _, err := s.Create(ctx, "stopped", 0); !errors.Is(err, failpoint.ErrInjected) {
		t.Fatalf("create at volume/create/dir: %v", err)
	}
	failpoint.Arm("volume/create/dir", "")
	if _, err := open(t, filepath.Join(d.Root(), "volumes")).Get("stopped"); err == nil {
		t.Fatal("a create stopped at volume/create/dir left a volume")
	}
	if entries, _ := os.ReadDir(filepath.Join(d.Root(), "volumes")); len(entries) != 1 {
		t.Fatalf("volume directories after a stopped create: %v, want only %s", entries, v.ID)
	}
}
