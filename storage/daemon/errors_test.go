package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
)

// TestInternalFailuresAreNotInvalid: failures of the daemon's own steps (an
// export that cannot listen, an injected I/O error) come back as internal
// errors, never as invalid input, and leave nothing behind.
func TestInternalFailuresAreNotInvalid(t *testing.T) {
	f := newFixture(t, 61)
	opts := testOptions(t)
	h := start(t, opts)
	ctx := ctxT(t)
	// Device 0's export socket path is taken by a non-empty directory.
	blocker := filepath.Join(opts.RunDir, "nbd-0.sock")
	if err := os.MkdirAll(filepath.Join(blocker, "x"), 0o700); err != nil {
		t.Fatal(err)
	}
	_, err := h.c.Create(ctx, rpc.CreateParams{Image: f.config})
	if !errors.Is(err, rpc.ErrInternal) || errors.Is(err, rpc.ErrInvalid) {
		t.Fatalf("create whose export cannot listen: %v, want internal", err)
	}
	if err := os.RemoveAll(blocker); err != nil {
		t.Fatal(err)
	}
	for _, point := range []string{"storaged/create/after-config", "storaged/create/after-record"} {
		if err := failpoint.Arm(point, "error"); err != nil {
			t.Fatal(err)
		}
		_, err := h.c.Create(ctx, rpc.CreateParams{Image: f.config})
		failpoint.Arm(point, "")
		if !errors.Is(err, rpc.ErrInternal) {
			t.Fatalf("create with %s failing: %v, want internal", point, err)
		}
	}
	dev, err := h.c.Create(ctx, rpc.CreateParams{Image: f.config})
	if err != nil {
		t.Fatal(err)
	}
	if err := failpoint.Arm("storaged/restack/after-config", "error"); err != nil {
		t.Fatal(err)
	}
	_, err = h.c.Restack(ctx, rpc.RestackParams{ID: dev.ID})
	failpoint.Arm("storaged/restack/after-config", "")
	if !errors.Is(err, rpc.ErrInternal) {
		t.Fatalf("restack with a failing step: %v, want internal", err)
	}
	devs, err := h.c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	checkNoOrphans(t, opts.StateDir, opts.RunDir, devs)
	if len(devs) != 1 || len(devs[0].Layers) != 1 {
		t.Fatalf("after the failed operations: %+v", devs)
	}
	if _, err := h.c.Restack(ctx, rpc.RestackParams{ID: dev.ID}); err != nil {
		t.Fatalf("restack after a failed one: %v", err)
	}
}
