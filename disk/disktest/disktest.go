// Package disktest gives tests a node's storage: the storage daemon run in
// process on a temporary directory (disk.StartLocal).
package disktest

import (
	"context"
	"testing"

	"github.com/agentenv/agentenv/disk"
)

// Devices starts the in-process storage daemon on a temporary directory of
// t and stops it when t ends.
func Devices(t testing.TB) disk.Devices {
	t.Helper()
	l, err := disk.StartLocal(context.Background(), t.TempDir(), nil)
	if err != nil {
		t.Fatalf("in-process storage daemon: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("stop the in-process storage daemon: %v", err)
		}
	})
	return l.Devices()
}
