package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/nbd"
)

// TestFailpointCrashInRestack runs the real command with a crash armed
// after the restack's seal: the process dies, a restarted one serves the
// device with its flushed write, and the restack then succeeds. (The full
// matrix over every point is storage/daemon's TestCrashMatrix.)
func TestFailpointCrashInRestack(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := baseImage(ctx, t, dir)
	p, c := spawn(t, dir, failpoint.EnvVar+"=storaged/restack/after-seal=crash")
	dev, nc := flushedWrite(ctx, t, c, cfg, "sealed?", 8192)
	nc.Close()
	if _, err := c.Restack(ctx, rpc.RestackParams{ID: dev.ID}); err == nil {
		t.Fatal("restack answered although the daemon was to crash in it")
	}
	<-p.done
	var ee *exec.ExitError
	if !errors.As(p.err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("daemon exit %v, want SIGKILL", p.err)
	}
	_, c2 := spawn(t, dir)
	res, err := c2.Restack(ctx, rpc.RestackParams{ID: dev.ID})
	if err != nil {
		t.Fatalf("restack after the crash: %v", err)
	}
	nc2, err := nbd.Dial(ctx, "unix", dev.Socket, dev.Export)
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	got := make([]byte, 7)
	if _, err := nc2.ReadAt(got, 8192); err != nil || string(got) != "sealed?" || len(res.Device.Layers) != 2 {
		t.Fatalf("after crash and restack: %q %v, layers %v", got, err, res.Device.Layers)
	}
}

// TestMisspeltFailpointRefused: an armed name no package declares stops
// the daemon at startup instead of silently never firing.
func TestMisspeltFailpointRefused(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-socket", filepath.Join(dir, "s.sock"), "-state-dir", filepath.Join(dir, "state"), "-run-dir", filepath.Join(dir, "run"))
	cmd.Env = append(os.Environ(), "AENV_STORAGED_TEST_MAIN=1", failpoint.EnvVar+"=storaged/restack/after-sael=crash")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "after-sael") {
		t.Fatalf("daemon with a misspelt failpoint: %v: %s", err, out)
	}
}
