// Package memfstest holds what tests of FUSE memory exports share: the one
// check that a FUSE mount can be made here.
package memfstest

import (
	"os"
	"testing"

	"github.com/agentenv/agentenv/internal/testenv"
)

// Require ends t where a FUSE mount cannot be made: it skips when not
// root (mount(2) needs it; CI runs as root), and reports a missing
// /dev/fuse through testenv.Missing, since the machines this project
// runs on have FUSE built in (so CI fails rather than skips).
func Require(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("FUSE exports mount with mount(2): needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		testenv.Missing(t, "no FUSE device (the kernel's fuse module): %v", err)
	}
}
