// Command aenv-storaged is the storage daemon: it owns every block export of
// a layered image (NBD today, ublk later) and answers aenvd over a Unix-socket
// RPC (package storage/daemon/rpc: 4-byte big-endian length + JSON frames).
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/internal/inherited"
	"github.com/agentenv/agentenv/internal/version"
	"github.com/agentenv/agentenv/storage/blob"
	"github.com/agentenv/agentenv/storage/daemon"
	"github.com/agentenv/agentenv/storage/memfs"
)

func main() {
	// A hidden mode: the process that holds the FUSE connection of shared
	// memory exports across restarts of the daemon (memfs keeper).
	memfs.RunKeeperIfAsked()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "aenv-storaged:", err)
		os.Exit(1)
	}
}

func run() error {
	if err := inherited.CloseOnExec(); err != nil {
		return err
	}
	socket := flag.String("socket", "/run/aenv-storaged/storaged.sock", "RPC socket path")
	state := flag.String("state-dir", "/var/lib/aenv-storaged", "state directory (device records, uppers, sealed layers)")
	runDir := flag.String("run-dir", "/run/aenv-storaged", "directory for NBD export sockets")
	poolLow := flag.Int("pool-low", 0, "default warm-pool low watermark per writable image shape (0: pool only shapes given to the warm call)")
	poolHigh := flag.Int("pool-high", 0, "default warm-pool high watermark per writable image shape")
	maxDevices := flag.Uint("max-devices", 4096, "largest number of devices")
	sharedBlock := flag.String("shared-block", daemon.SharedDefault,
		"how shared read-only (memory) devices are exported: empty for ublk where loaded, auto (ublk, else a FUSE file under run-dir/mem), ublk, fuse or none")
	memUID := flag.Uint("mem-uid", 0, "uid (and gid) owning the FUSE memory files: the VMM's; non-zero lets that uid into the mount")
	layerWait := flag.Duration("layer-wait", blob.DefaultServerWait,
		"how long a read of a lazily restored layer waits for aenvd's layer socket while aenvd restarts, before it fails (an I/O error in the guest)")
	debug := flag.Bool("debug", false, "log at debug level")
	printVersion := flag.Bool("version", false, "print the version, commit and build date and exit")
	flag.Parse()
	if *printVersion {
		fmt.Println("aenv-storaged", version.Get())
		return nil
	}

	level := slog.LevelInfo
	if *debug {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	slog.SetDefault(log)
	// A misspelt failpoint must fail the test that armed it, not never fire.
	if err := failpoint.Check(); err != nil {
		return err
	}
	if armed := failpoint.Armed(); len(armed) > 0 {
		log.Warn("failpoints armed", "points", armed)
	}

	d, err := daemon.New(daemon.Options{
		Socket: *socket, StateDir: *state, RunDir: *runDir, Logger: log,
		PoolLow: *poolLow, PoolHigh: *poolHigh, MaxDevices: uint32(*maxDevices),
		SharedBlock: *sharedBlock, MemFS: memfs.Options{UID: uint32(*memUID), GID: uint32(*memUID)},
		LayerWait: *layerWait,
	})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	return d.Run(ctx)
}
