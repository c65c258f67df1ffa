package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/storage/memfs"
)

// helperEnv makes the test binary run as a storage daemon on the directory
// it names (DIR/state, DIR/run, DIR/run/storaged.sock), for the crash tests.
const helperEnv = "AENV_STORAGED_HELPER_DIR"

func TestMain(m *testing.M) {
	memfs.RunKeeperIfAsked()
	if arg := os.Getenv(mapReaderEnv); arg != "" {
		os.Exit(mapReaderMain(arg))
	}
	if dir := os.Getenv(helperEnv); dir != "" {
		os.Exit(helperMain(dir))
	}
	os.Exit(m.Run())
}

func helperMain(dir string) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := failpoint.Check(); err != nil {
		log.Error("failpoints", "err", err)
		return 2
	}
	log.Info("failpoints armed", "points", failpoint.Armed())
	d, err := New(helperOptions(dir, log))
	if err == nil {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		defer stop()
		err = d.Run(ctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func helperOptions(dir string, log *slog.Logger) Options {
	return Options{
		Socket: filepath.Join(dir, "run", "storaged.sock"), StateDir: filepath.Join(dir, "state"),
		RunDir: filepath.Join(dir, "run"), Logger: log, SharedBlock: os.Getenv(helperSharedEnv),
	}
}
