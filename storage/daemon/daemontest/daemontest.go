// Package daemontest runs a storage daemon in the test's process, for tests
// of its consumers (the VMM layer, the orchestrator) against the real one.
package daemontest

import (
	"context"
	"crypto/sha256"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentenv/agentenv/storage/daemon"
	"github.com/agentenv/agentenv/storage/daemon/client"
)

// Start runs a daemon with its state under a temporary directory until the
// test ends and returns a client of it.
func Start(ctx context.Context, t testing.TB) *client.Client {
	t.Helper()
	return StartWith(ctx, t, func(*daemon.Options) {})
}

// StartWith is Start with the daemon's options changed by edit first (for
// example its SharedBlock).
func StartWith(ctx context.Context, t testing.TB, edit func(*daemon.Options)) *client.Client {
	t.Helper()
	dir := t.TempDir()
	opts := daemon.Options{
		Socket: filepath.Join(dir, "storaged.sock"), StateDir: filepath.Join(dir, "state"), RunDir: filepath.Join(dir, "run"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	edit(&opts)
	d, err := daemon.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })
	for {
		c, err := client.Dial(ctx, opts.Socket)
		if err == nil {
			t.Cleanup(func() { c.Close() })
			return c
		}
		select {
		case err := <-done:
			t.Fatalf("storage daemon exited: %v", err)
		case <-ctx.Done():
			t.Fatal("storage daemon did not come up")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// SumFile returns the SHA-256 of a file's or block device's bytes, for
// comparing what a device serves with what it should.
func SumFile(t testing.TB, path string) [32]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatalf("read %s: %v", path, err)
	}
	return [32]byte(h.Sum(nil))
}
