package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/storage/daemon/client"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/image"
	"github.com/agentenv/agentenv/storage/nbd"
)

// TestMain lets the test binary act as aenv-storaged, so the tests run the
// real command as a separate process without a separate build.
func TestMain(m *testing.M) {
	if os.Getenv("AENV_STORAGED_TEST_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

type proc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited; err is then set
	err  error
}

func spawn(t *testing.T, dir string, env ...string) (*proc, *client.Client) {
	t.Helper()
	sock := filepath.Join(dir, "run", "storaged.sock")
	cmd := exec.Command(os.Args[0], "-socket", sock, "-state-dir", filepath.Join(dir, "state"), "-run-dir", filepath.Join(dir, "run"))
	cmd.Env = append(append(os.Environ(), "AENV_STORAGED_TEST_MAIN=1"), env...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-p.done })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		if c, err := client.Dial(ctx, sock); err == nil {
			t.Cleanup(func() { c.Close() })
			return p, c
		}
		select {
		case <-p.done:
			t.Fatalf("aenv-storaged exited: %v", p.err)
		case <-ctx.Done():
			t.Fatal("aenv-storaged did not come up")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestCrashAndRestart kills the daemon with SIGKILL after a flushed write and
// checks that a new daemon re-exports the device with the data; then shuts
// it down over RPC and checks it exits cleanly.
func TestCrashAndRestart(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := baseImage(ctx, t, dir)
	p, c := spawn(t, dir)
	dev, nc := flushedWrite(ctx, t, c, cfg, "durable", 777)
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	if _, err := nc.ReadAt(make([]byte, 1), 0); err == nil {
		t.Fatal("export still answers after the daemon was killed")
	}
	nc.Close()

	p2, c2 := spawn(t, dir)
	nc2, err := nbd.Dial(ctx, "unix", dev.Socket, dev.Export)
	if err != nil {
		t.Fatalf("device not re-exported after a crash: %v", err)
	}
	got := make([]byte, 7)
	if _, err := nc2.ReadAt(got, 777); err != nil || string(got) != "durable" {
		t.Fatalf("after crash: %q %v", got, err)
	}
	nc2.Close()
	if err := c2.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p2.done:
		if p2.err != nil {
			t.Fatalf("aenv-storaged exited with %v after shutdown", p2.err)
		}
	case <-ctx.Done():
		t.Fatal("aenv-storaged did not exit after shutdown")
	}
}

// flushedWrite creates a device of the image cfg and writes data at off
// through its NBD export, flushed: what a crash must not lose.
func flushedWrite(ctx context.Context, t *testing.T, c *client.Client, cfg, data string, off int64) (rpc.Device, *nbd.Client) {
	t.Helper()
	dev, err := c.Create(ctx, rpc.CreateParams{Image: cfg})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nbd.Dial(ctx, "unix", dev.Socket, dev.Export)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.WriteAt([]byte(data), off); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return dev, nc
}

// baseImage writes a 4 MiB zero base layer and an image config on it into
// dir and returns the config's path.
func baseImage(ctx context.Context, t *testing.T, dir string) string {
	t.Helper()
	base := filepath.Join(dir, "base.raw")
	if err := os.WriteFile(base, make([]byte, 4<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := image.ImportRaw(ctx, base, filepath.Join(dir, "base.lsmt"), image.CommitOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "image.json")
	if err := (&image.Config{Lowers: []image.LayerRef{{File: "base.lsmt"}}}).Save(cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}
