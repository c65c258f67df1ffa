package image

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/internal/crashdisk"
)

// TestPowerLossAfterCommitAndCreate: once Commit and Create have returned,
// a power loss leaves the layer and the config that names it whole, so the
// image opens and reads what was committed.
func TestPowerLossAfterCommitAndCreate(t *testing.T) {
	d := crashdisk.New(t, 64)
	ctx := context.Background()
	root := d.Root()
	first := filepath.Join(root, "first.json")
	if _, err := Create(ctx, first, CreateSpec{Size: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	im, err := Open(ctx, first, Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte("committed"), 1000)
	if _, err := im.WriteAt(want, 4096); err != nil {
		t.Fatal(err)
	}
	if _, err := im.Commit(ctx, filepath.Join(root, "l1.lsmt"), CommitOptions{Message: "one"}); err != nil {
		t.Fatal(err)
	}
	im.Close()
	second := filepath.Join(root, "second.json")
	if _, err := Create(ctx, second, CreateSpec{Lowers: []string{"l1.lsmt"}}); err != nil {
		t.Fatal(err)
	}
	crashed := d.Crash()
	got, err := Open(ctx, filepath.Join(crashed, "second.json"), Options{ReadOnly: true})
	if err != nil {
		t.Fatalf("after a power loss the created image does not open: %v", err)
	}
	defer got.Close()
	b := make([]byte, len(want))
	if _, err := got.ReadAt(b, 4096); err != nil || !bytes.Equal(b, want) {
		t.Fatalf("after a power loss the committed data reads back wrong (%v)", err)
	}
}
