package kernellane

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// TestLane boots the lane (qemu-system-x86_64, TCG) with this package's
// test binary and runs TestGuestModules inside it.
func TestLane(t *testing.T) {
	res := RunTests(t, Options{Run: "^TestGuestModules$", Modules: []string{"ublk_drv", "nbd", "loop"}}, "TestGuestModules")
	if !strings.Contains(res.Output, "guest kernel 6.12") {
		t.Errorf("the guest did not report its kernel version")
	}
}

// TestGuestModules runs in the guest: the modules the lane loaded are live
// and their control nodes exist.
func TestGuestModules(t *testing.T) {
	if !InGuest() {
		t.Skip("runs inside the kernel lane (TestLane)")
	}
	rel, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("guest kernel %s", bytes.TrimSpace(rel))
	mods, err := os.ReadFile("/proc/modules")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"ublk_drv", "nbd", "loop"} {
		if !bytes.Contains(mods, []byte(m+" ")) {
			t.Errorf("module %s not loaded:\n%s", m, mods)
		}
	}
	for _, p := range []string{"/dev/ublk-control", "/dev/nbd0", "/dev/loop-control"} {
		if _, err := os.Stat(p); err != nil {
			t.Error(err)
		}
	}
}
