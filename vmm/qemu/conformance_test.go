package qemu_test

import (
	"context"
	"os"
	"testing"

	"github.com/agentenv/agentenv/internal/testutil/guestassets"
	"github.com/agentenv/agentenv/vmm/qemu"
	"github.com/agentenv/agentenv/vmm/vmmtest"
)

func TestConformance(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the suite creates network namespaces and taps")
	}
	a := guestassets.Get(t)
	d, err := qemu.New(context.Background(), qemu.Options{ProbeKernel: a.Kernel})
	if err != nil {
		t.Fatal(err)
	}
	accel, why := d.Accel()
	t.Logf("qemu accelerator: %s (%s)", accel, why)
	// Confined, as a node runs its VMMs (each its own uid, in its jail).
	base := 2000300000 + uint32(os.Getpid()%1000)*16
	vmmtest.Run(t, vmmtest.Harness{Driver: d, Kernel: a.Kernel, Initrd: a.Initrd, Rootfs: a.Rootfs, UIDBase: base})
}
