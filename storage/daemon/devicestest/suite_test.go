package devicestest_test

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentenv/agentenv/storage/daemon"
	"github.com/agentenv/agentenv/storage/daemon/client"
	"github.com/agentenv/agentenv/storage/daemon/devicestest"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
)

// run starts a daemon on a fresh directory until the test ends.
func run(t *testing.T, cfg devicestest.Config, socket bool) *daemon.Daemon {
	dir := t.TempDir()
	opts := daemon.Options{
		StateDir: filepath.Join(dir, "state"), RunDir: filepath.Join(dir, "run"), MaxDevices: cfg.MaxDevices,
		SharedBlock: cfg.SharedBlock,
		Logger:      slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if socket {
		opts.Socket = filepath.Join(dir, "run", "storaged.sock")
	}
	d, err := daemon.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("daemon: %v", err)
		}
	})
	return d
}

func TestLocal(t *testing.T) {
	devicestest.Run(t, func(t *testing.T, cfg devicestest.Config) client.Devices {
		return run(t, cfg, false).Local()
	})
}

func TestRPC(t *testing.T) { devicestest.Run(t, rpcFactory) }

func rpcFactory(t *testing.T, cfg devicestest.Config) client.Devices {
	d := run(t, cfg, true)
	sock := d.Socket()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		c, err := client.Dial(ctx, sock)
		if err == nil {
			t.Cleanup(func() { c.Close() })
			return c
		}
		if ctx.Err() != nil {
			t.Fatalf("dial %s: %v", sock, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSharedUblk and TestSharedFUSE run the shared-export checks over RPC
// against daemons started with each transport.
func TestSharedUblk(t *testing.T) { devicestest.RunShared(t, rpc.BlockUblk, rpcFactory) }

func TestSharedFUSE(t *testing.T) { devicestest.RunShared(t, rpc.BlockFUSE, rpcFactory) }

func TestSharedFUSELocal(t *testing.T) {
	devicestest.RunShared(t, rpc.BlockFUSE, func(t *testing.T, cfg devicestest.Config) client.Devices {
		return run(t, cfg, false).Local()
	})
}
