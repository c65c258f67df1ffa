package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckDrives(t *testing.T) {
	for _, ok := range [][]string{nil, {"vdb"}, {"vdb", "vdc", "vdz"}} {
		if err := checkDrives(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	many := make([]string, maxInitDrives+1)
	for i := range many {
		many[i] = "vdb"
	}
	for _, bad := range [][]string{{"vda"}, {"sda"}, {"vdb/../vda"}, {"../../x"}, {""}, {"vdbb"}, {"VDB"}, many} {
		if err := checkDrives(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestReprobeDisks: on a sysfs tree of files, each disk's virtio device is
// written to the driver's unbind and then bind files; a disk without a
// device is an error.
func TestReprobeDisks(t *testing.T) {
	sys := t.TempDir()
	drv := filepath.Join(sys, "bus", "virtio", "drivers", "virtio_blk")
	for _, d := range []string{drv, filepath.Join(sys, "block", "vdb"), filepath.Join(sys, "devices", "virtio3")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("../../devices/virtio3", filepath.Join(sys, "block", "vdb", "device")); err != nil {
		t.Fatal(err)
	}
	if err := reprobeDisks(sys, []string{"vdb"}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"unbind", "bind"} {
		b, err := os.ReadFile(filepath.Join(drv, f))
		if err != nil || string(b) != "virtio3" {
			t.Fatalf("%s: %q %v, want virtio3", f, b, err)
		}
	}
	if err := reprobeDisks(sys, []string{"vdc"}); err == nil || !strings.Contains(err.Error(), "vdc") {
		t.Fatalf("a disk without a device: %v", err)
	}
}
