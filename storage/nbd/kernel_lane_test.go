//go:build linux

package nbd_test

import (
	"context"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/kernellane"
	"github.com/agentenv/agentenv/internal/kernellane/blockcheck"
	"github.com/agentenv/agentenv/storage/nbd"
)

// TestKernelLane runs the kernel attach tests inside the kernel lane
// (QEMU booting a kernel with the nbd module), where they
// must pass, not skip.
func TestKernelLane(t *testing.T) {
	kernellane.RunTests(t, kernellane.Options{Run: "^TestAttachKernel", Modules: []string{"nbd"}},
		"TestAttachKernel", "TestAttachKernelStackedImage")
}

// TestAttachKernelStackedImage serves a three-layer image over our NBD
// server, attaches it as /dev/nbdN and runs the block device checks.
func TestAttachKernelStackedImage(t *testing.T) {
	if err := nbd.KernelAvailable(); err != nil {
		t.Skipf("kernel NBD unavailable: %v", err)
	}
	fx := blockcheck.NewFixture(t, t.TempDir(), 16<<20, 1)
	im := fx.Open(t, false)
	srv := nbd.NewServer(nbd.Options{})
	if err := srv.Add(nbd.Export{Name: "stack", Backend: im}); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kd, err := nbd.AttachKernel(ctx, srv, "stack", 2)
	if err != nil {
		t.Fatal(err)
	}
	defer kd.Detach()
	blockcheck.CheckAll(t, &blockcheck.Device{Path: kd.Path, Model: fx.Model, Backend: im})
}
