package vmtest

import (
	"os"
	"testing"

	"github.com/agentenv/agentenv/storage/memfs"
)

// TestMain lets this test binary be the keeper of a storage daemon's FUSE
// memory mount (memfs keeper.go), and a storage daemon a test can kill.
func TestMain(m *testing.M) {
	memfs.RunKeeperIfAsked()
	if dir := os.Getenv(storagedEnv); dir != "" {
		os.Exit(storagedMain(dir))
	}
	os.Exit(m.Run())
}
