package client_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentenv/agentenv/storage/daemon"
	"github.com/agentenv/agentenv/storage/daemon/client"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
)

// TestMain lets the test binary act as the daemon for Ensure.
func TestMain(m *testing.M) {
	if os.Getenv("AENV_STORAGED_CLIENT_TEST") == "1" {
		fs := flag.NewFlagSet("storaged", flag.ExitOnError)
		sock := fs.String("socket", "", "")
		state := fs.String("state-dir", "", "")
		run := fs.String("run-dir", "", "")
		fs.Parse(os.Args[1:])
		d, err := daemon.New(daemon.Options{Socket: *sock, StateDir: *state, RunDir: *run})
		if err == nil {
			err = d.Run(context.Background())
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestEnsureStartsOnceAndShutdown(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := client.StartOptions{
		Socket:  filepath.Join(dir, "storaged.sock"),
		Binary:  os.Args[0],
		Args:    []string{"-state-dir", filepath.Join(dir, "state"), "-run-dir", filepath.Join(dir, "run")},
		Env:     append(os.Environ(), "AENV_STORAGED_CLIENT_TEST=1"),
		LogFile: filepath.Join(dir, "storaged.log"),
	}
	// The daemon runs in its own session: make sure a failing test stops it.
	t.Cleanup(func() {
		if c, err := client.Dial(context.Background(), opts.Socket); err == nil {
			c.Shutdown(context.Background())
			c.Close()
		}
	})
	c1, err := client.Ensure(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	c2, err := client.Ensure(ctx, opts) // already running: just connects
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if f, err := c2.Features(ctx); err != nil || f.ProtocolVersion != rpc.ProtocolVersion {
		t.Fatalf("features %+v %v", f, err)
	}
	if _, err := c1.Create(ctx, rpc.CreateParams{Image: filepath.Join(dir, "missing.json")}); err == nil {
		t.Fatal("create from a missing image succeeded")
	}
	if err := c1.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	// After shutdown the socket stops answering (poll; the test deadline bounds it).
	for {
		if _, err := c2.Features(ctx); err != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestCallRedialsAfterRestart: a client survives a daemon restart.
func TestCallRedialsAfterRestart(t *testing.T) {
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := daemon.Options{Socket: filepath.Join(dir, "s.sock"), StateDir: filepath.Join(dir, "state"), RunDir: filepath.Join(dir, "run")}
	run := func() (context.CancelFunc, chan error) {
		d, err := daemon.New(opts)
		if err != nil {
			t.Fatal(err)
		}
		rctx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- d.Run(rctx) }()
		return stop, done
	}
	stop, done := run()
	var c *client.Client
	for c == nil {
		c, _ = client.Dial(ctx, opts.Socket)
		time.Sleep(10 * time.Millisecond)
	}
	defer c.Close()
	if _, err := c.Features(ctx); err != nil {
		t.Fatal(err)
	}
	stop()
	<-done
	stop, done = run()
	defer func() { stop(); <-done }()
	for {
		_, err := c.Features(ctx)
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("client never reconnected: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
