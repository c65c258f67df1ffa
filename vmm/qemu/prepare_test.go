package qemu

import (
	"strings"
	"testing"

	"github.com/agentenv/agentenv/vmm"
)

// TestSameMachine: a prepared machine takes the state of a snapshot of the
// same machine whatever backs its devices, and refuses any other.
func TestSameMachine(t *testing.T) {
	t.Parallel()
	base := func() *machineSpec {
		return &machineSpec{Version: specVersion, Kernel: "/k", Cmdline: "console=ttyS0", VCPUs: 1, MemoryMiB: 256, Accel: "tcg",
			Drives: []vmm.Drive{{ID: "rootfs", Path: "/a"}, {ID: "drive1", Empty: true}}, NICs: []savedNIC{{ID: "eth0", MAC: "02:00:00:00:00:01"}}}
	}
	other := base()
	other.Drives[0] = vmm.Drive{ID: "rootfs", NBD: &vmm.NBDSource{Socket: "/s"}}
	if why := sameMachine(base(), other); why != "" {
		t.Fatalf("another disk in the same slot: %s", why)
	}
	for name, change := range map[string]func(s *machineSpec){
		"memory":  func(s *machineSpec) { s.MemoryMiB = 512 },
		"kernel":  func(s *machineSpec) { s.Cmdline += " quiet" },
		"drives":  func(s *machineSpec) { s.Drives = s.Drives[:1] },
		"nic mac": func(s *machineSpec) { s.NICs[0].MAC = "02:00:00:00:00:02" },
		"version": func(s *machineSpec) { s.Version = 1 },
	} {
		s := base()
		change(s)
		if why := sameMachine(base(), s); why == "" || strings.TrimSpace(why) == "" {
			t.Errorf("%s changed: the snapshot loads into the prepared machine", name)
		}
	}
}
