package daemon

import (
	"bytes"
	"errors"
	"os"
	"testing"

	"github.com/agentenv/agentenv/internal/kernellane"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/ublk"
)

// TestKernelLane runs the kernel block device tests inside the kernel lane
// (QEMU booting a kernel with ublk_drv and nbd), where they
// must pass, not skip.
func TestKernelLane(t *testing.T) {
	kernellane.RunTests(t, kernellane.Options{Run: "^(TestKernelAttach|TestUblkExport)$", Modules: []string{"ublk_drv", "nbd"}},
		"TestKernelAttach", "TestUblkExport")
}

// TestUblkExport exports a device as /dev/ublkbN next to its NBD socket
// where the driver is loaded, and refuses cleanly where it is not.
func TestUblkExport(t *testing.T) {
	f := newFixture(t, 14)
	h := start(t, testOptions(t))
	ctx := ctxT(t)
	feats, err := h.c.Features(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := h.c.Create(ctx, rpc.CreateParams{Image: f.config, Block: rpc.BlockUblk})
	if why := ublk.Available(); why != nil {
		if feats.Ublk || !isCode(err, rpc.CodeInvalid) {
			t.Fatalf("without ublk: features %+v, create err %v", feats, err)
		}
		t.Skipf("ublk unavailable: %v", why)
	}
	if err != nil {
		t.Fatal(err)
	}
	if !feats.Ublk || rpc.ChooseBlock(feats) != rpc.BlockUblk {
		t.Fatalf("features %+v: want ublk chosen", feats)
	}
	if dev.Block != rpc.BlockUblk || dev.Socket == "" {
		t.Fatalf("device %+v: want a ublk block device next to the NBD socket", dev)
	}
	kf, err := os.OpenFile(dev.BlockDevice, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(f.want))
	if _, err := kf.ReadAt(got, 0); err != nil || !bytes.Equal(got, f.want) {
		t.Fatalf("read through %s: %v (equal %v)", dev.BlockDevice, err, bytes.Equal(got, f.want))
	}
	// A write through the block device is seen over the NBD socket.
	msg := bytes.Repeat([]byte("ublk"), 1024)
	if _, err := kf.WriteAt(msg, 8192); err != nil {
		t.Fatal(err)
	}
	if err := kf.Sync(); err != nil {
		t.Fatal(err)
	}
	kf.Close()
	nc := dialDev(t, dev)
	back := make([]byte, len(msg))
	if _, err := nc.ReadAt(back, 8192); err != nil || !bytes.Equal(back, msg) {
		t.Fatalf("read over NBD after a ublk write: %v", err)
	}
	if err := h.c.Delete(ctx, dev.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dev.BlockDevice); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s after delete: %v, want gone", dev.BlockDevice, err)
	}
}
