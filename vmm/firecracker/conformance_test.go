package firecracker

import (
	"fmt"
	"os"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/internal/testutil/guestassets"
	"github.com/agentenv/agentenv/vmm/vmmtest"
)

// TestConformance runs the shared vmm suite (vmm/vmmtest) against a real
// Firecracker. It needs AENV_TEST_FIRECRACKER=/path/to/firecracker and a
// /dev/kvm that runs Firecracker guests; AENV_TEST_FIRECRACKER_KERNEL may
// name an uncompressed vmlinux, since Firecracker on x86 boots ELF kernels
// only.
func TestConformance(t *testing.T) {
	bin := os.Getenv("AENV_TEST_FIRECRACKER")
	if bin == "" {
		t.Skip("AENV_TEST_FIRECRACKER is not set: no firecracker binary to run the conformance suite against")
	}
	if err := kvmUsable(); err != nil {
		t.Skipf("no usable KVM for Firecracker: %v", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root: the suite creates network namespaces and taps")
	}
	d, err := New(Options{Binary: bin})
	if err != nil {
		t.Fatal(err)
	}
	a := guestassets.Get(t)
	kernel := a.Kernel
	if k := os.Getenv("AENV_TEST_FIRECRACKER_KERNEL"); k != "" {
		kernel = k
	}
	vmmtest.Run(t, vmmtest.Harness{Driver: &tapsByName{Driver: d}, Kernel: kernel, Initrd: a.Initrd, Rootfs: a.Rootfs})
}

// kvmUsable opens /dev/kvm the way Firecracker does.
func kvmUsable() error {
	fd, err := unix.Open("/dev/kvm", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("/dev/kvm: %w", err)
	}
	return unix.Close(fd)
}
