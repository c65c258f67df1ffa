package devicestest_test

import (
	"os"
	"testing"

	"github.com/agentenv/agentenv/storage/memfs"
)

// TestMain lets this test binary be the keeper of the FUSE memory mount
// of a storage daemon the tests run in-process (memfs keeper.go).
func TestMain(m *testing.M) {
	memfs.RunKeeperIfAsked()
	os.Exit(m.Run())
}
