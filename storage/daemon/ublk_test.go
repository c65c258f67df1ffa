package daemon

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/kernellane"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/ublk"
	"golang.org/x/sys/unix"
)

// TestKernelLane runs the kernel block device tests inside the kernel lane
// (QEMU booting a kernel with ublk_drv and nbd), where they
// must pass, not skip.
func TestKernelLane(t *testing.T) {
	kernellane.RunTests(t, kernellane.Options{Run: "^(TestKernelAttach|TestUblkExport|TestUblkSurvivesDaemonCrash)$", Modules: []string{"ublk_drv", "nbd"}},
		"TestKernelAttach", "TestUblkExport", "TestUblkSurvivesDaemonCrash")
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
	if !feats.Ublk || rpc.ChooseBlock(feats, true) != rpc.BlockUblk {
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

// TestUblkSurvivesDaemonCrash kills the daemon (SIGKILL) under a device
// exported as ublk while a reader waits on it: /dev/ublkbN stays, the next
// daemon recovers the same device from its record, and the waiting read
// completes with the device's bytes.
func TestUblkSurvivesDaemonCrash(t *testing.T) {
	if err := ublk.Available(); err != nil {
		t.Skipf("ublk unavailable: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fx := newFixture(t, 15)
	dir := t.TempDir()
	log, err := os.Create(filepath.Join(dir, "storaged.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	r := &crashRun{t: t, ctx: ctx, dir: dir, fx: fx, log: log}
	r.spawn("")
	dev, err := r.c.Create(ctx, rpc.CreateParams{Image: fx.config, Block: rpc.BlockUblk})
	if err != nil {
		t.Fatal(err)
	}
	kf, err := os.OpenFile(dev.BlockDevice, os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer kf.Close()
	buf, _ := unix.Mmap(-1, 0, 64<<10, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	copy(buf, bytes.Repeat([]byte("survive!"), len(buf)/8))
	if _, err := kf.WriteAt(buf, 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := kf.Sync(); err != nil {
		t.Fatal(err)
	}
	r.cmd.Process.Kill()
	if !r.crashed() {
		t.Fatal("daemon did not die of SIGKILL")
	}
	r.c.Close()
	r.c = nil
	read := make(chan error, 1)
	got, _ := unix.Mmap(-1, 0, 64<<10, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	go func() { _, err := kf.ReadAt(got, 1<<20); read <- err }()
	if _, err := os.Stat(dev.BlockDevice); err != nil {
		t.Fatalf("%s with its daemon dead: %v", dev.BlockDevice, err)
	}
	r.spawn("")
	if err := <-read; err != nil {
		t.Fatalf("read across the daemon crash: %v", err)
	}
	if !bytes.Equal(got, buf) {
		t.Fatal("read across the daemon crash returned other bytes")
	}
	var after rpc.Device
	for _, d := range r.list() {
		if d.ID == dev.ID {
			after = d
		}
	}
	if after.BlockDevice != dev.BlockDevice || after.Block != rpc.BlockUblk {
		t.Fatalf("after recovery the device is %q (%s), want %q", after.BlockDevice, after.Block, dev.BlockDevice)
	}
	want := fx.want[:4096]
	if _, err := kf.ReadAt(got[:4096], 0); err != nil || !bytes.Equal(got[:4096], want) {
		t.Fatalf("read of the recovered device: %v", err)
	}
	kf.Close() // deleting a ublk device waits for its openers
	if err := r.c.Delete(ctx, dev.ID); err != nil {
		t.Fatal(err)
	}
}
