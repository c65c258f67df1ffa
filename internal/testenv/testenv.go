// Package testenv tells the two kinds of skipped test apart. A test that
// needs a tool or server the machine setup installs (make setup: redis-server,
// versitygw, qemu-nbd, zstd, the kernel lane's kernel...) skips on a
// developer's machine without it, but fails in CI (CI=true), where a missing
// tool means a broken setup step and a skip would turn its suite green
// silently. A test that needs hardware or kernel support this kind of machine
// may lack (KVM, Firecracker, the ublk or nbd drivers) skips everywhere: call
// t.Skip for those as usual.
package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// TB is the part of testing.TB this package uses.
type TB interface {
	Helper()
	Skip(args ...any)
	Fatal(args ...any)
}

// Strict reports whether a missing tool fails the test rather than skipping
// it: CI sets CI=true (any of true, 1, yes).
func Strict() bool {
	switch strings.ToLower(strings.TrimSpace(os.Getenv("CI"))) {
	case "true", "1", "yes":
		return true
	}
	return false
}

// Missing ends the test because something the machine setup installs is
// absent: it skips, or fails under CI=true. The message says what is missing
// and which setup step installs it.
func Missing(t TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if Strict() {
		t.Fatal("CI=true and the setup should have installed this: " + msg)
	}
	t.Skip(msg)
}

// RequireTool returns the path of the named program, or ends the test through
// Missing; why says which package or setup step installs it.
func RequireTool(t TB, name, why string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Missing(t, "%s not installed (%s)", name, why)
	}
	return p
}
