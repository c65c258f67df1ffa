package vmmtest

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/vmm"
)

// prepared (drivers implementing vmm.Preparer): a VMM started ahead of its
// restore, its run directory moved to where its new owner keeps it, then
// the snapshot's state loaded, runs the snapshot's guest; after a detach it
// is adopted from the new directory, and its stop removes that directory.
func (s *suite) prepared(t *testing.T) {
	p, ok := s.h.Driver.(vmm.Preparer)
	if !ok {
		t.Skipf("driver %s cannot start a VMM ahead of its restore", s.h.Driver.Name())
	}
	ctx := context.Background()
	tn := NewTestNet(s.top)
	pooled, moved := filepath.Join(s.work, "prepared-pool"), filepath.Join(s.work, "prepared-owner")
	rc := s.restoreConfig("prepared", s.snap, tn.NIC())
	rc.RunDir = pooled
	vm, err := p.Prepare(ctx, rc)
	if err != nil {
		t.Fatal(err)
	}
	s.top.Cleanup(func() { _ = vm.Stop(context.Background()) })
	if err := vm.Move(moved); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(pooled); !errors.Is(err, os.ErrNotExist) || vm.Info().RunDir != moved {
		t.Fatalf("after the move: old directory %v, run directory %s, want %s", err, vm.Info().RunDir, moved)
	}
	if err := vm.Load(ctx, s.snap, nil, false); err != nil {
		t.Fatal(err)
	}
	s.waitReady(t, vm, tn)
	if got := sh(t, tn, "cat /dev/shm/marker"); got != marker {
		t.Fatalf("tmpfs file after a prepared restore = %q", got)
	}
	ad, ok := s.h.Driver.(vmm.Adopter)
	det, ok2 := vm.(vmm.Detacher)
	if !ok || !ok2 {
		return
	}
	pid := vm.Info().PID
	if err := det.Detach(); err != nil {
		t.Fatal(err)
	}
	again, err := ad.Adopt(ctx, moved)
	if err != nil {
		t.Fatalf("adopt from the moved run directory: %v", err)
	}
	s.top.Cleanup(func() { _ = again.Stop(context.Background()) })
	if got := again.Info(); got.PID != pid || got.ConsoleLog != filepath.Join(moved, "console.log") {
		t.Fatalf("adopted %+v, want pid %d with its console in %s", got, pid, moved)
	}
	if err := again.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(moved); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the moved run directory is left after Stop: %v", err)
	}
}
