//go:build linux

package ublk_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/kernellane"
	"github.com/agentenv/agentenv/internal/kernellane/blockcheck"
	"github.com/agentenv/agentenv/storage/ublk"
	"golang.org/x/sys/unix"
)

// TestKernelLane runs this package's device tests inside the kernel lane
// (qemu-system-x86_64 booting a kernel with ublk_drv), where they must
// pass, not skip.
func TestKernelLane(t *testing.T) {
	kernellane.RunTests(t, kernellane.Options{Run: "^TestDevice", Modules: []string{"ublk_drv"}},
		"TestDeviceStackedImage", "TestDeviceConcurrent", "TestDeviceRemoveWithIOInFlight",
		"TestDeviceRecovery", "TestDevicePrivateMapping")
}

func needUblk(t *testing.T) {
	t.Helper()
	if err := ublk.Available(); err != nil {
		t.Skipf("runs where the ublk driver is loaded (the kernel lane, TestKernelLane): %v", err)
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

// TestDeviceStackedImage serves a three-layer image as /dev/ublkbN with
// two queues and runs the block device checks.
func TestDeviceStackedImage(t *testing.T) {
	needUblk(t)
	fx := blockcheck.NewFixture(t, t.TempDir(), 16<<20, 1)
	im := fx.Open(t, false)
	defer im.Close()
	d, err := ublk.Create(ctx(t), im, ublk.Options{Queues: 2, Depth: 32})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	info, err := ublk.DeviceInfo(ctx(t), d.ID)
	if err != nil {
		t.Fatal(err)
	}
	if info.State != ublk.StateLive || info.Queues != 2 || info.Depth != 32 || info.ServerPID != os.Getpid() {
		t.Fatalf("device info %+v: want live, 2 queues of 32, served by us", info)
	}
	blockcheck.CheckAll(t, &blockcheck.Device{Path: d.Path, Model: fx.Model, Backend: im})
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.Path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s after Close: %v, want gone", d.Path, err)
	}
}

// TestDeviceConcurrent runs two devices at once, each with its own image.
func TestDeviceConcurrent(t *testing.T) {
	needUblk(t)
	var devs [2]*blockcheck.Device
	for i := range devs {
		fx := blockcheck.NewFixture(t, t.TempDir(), 8<<20, uint64(10+i))
		im := fx.Open(t, false)
		defer im.Close()
		d, err := ublk.Create(ctx(t), im, ublk.Options{Depth: 16})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		devs[i] = &blockcheck.Device{Path: d.Path, Model: fx.Model, Backend: im}
	}
	if devs[0].Path == devs[1].Path {
		t.Fatalf("both devices are %s", devs[0].Path)
	}
	var wg sync.WaitGroup
	for i, d := range devs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			blockcheck.CheckRandomIO(t, d, uint64(20+i))
		}()
	}
	wg.Wait()
	for _, d := range devs {
		blockcheck.CheckExact(t, d)
		blockcheck.CheckFlush(t, d)
	}
}

// TestDeviceRemoveWithIOInFlight closes a device while readers and writers
// hammer it: Close returns, their I/O ends in errors instead of hanging,
// and the device is gone from the driver.
func TestDeviceRemoveWithIOInFlight(t *testing.T) {
	needUblk(t)
	fx := blockcheck.NewFixture(t, t.TempDir(), 8<<20, 3)
	im := fx.Open(t, false)
	defer im.Close()
	d, err := ublk.Create(ctx(t), im, ublk.Options{Depth: 8})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{}, 4)
	errs := make(chan error, 4)
	var closing atomic.Bool
	for w := range 4 {
		go func() { errs <- hammer(d.Path, w%2 == 0, started, &closing) }()
	}
	for range 4 {
		<-started
	}
	closing.Store(true)
	if err := d.Close(); err != nil {
		t.Fatalf("close with I/O in flight: %v", err)
	}
	for range 4 {
		select {
		case err := <-errs:
			if err == nil || errors.Is(err, errEarly) {
				t.Errorf("hammer: %v, want an I/O error from the removal", err)
			}
		case <-ctx(t).Done():
			t.Fatal("I/O on the removed device hangs")
		}
	}
	if _, err := ublk.DeviceInfo(ctx(t), d.ID); err == nil {
		t.Fatalf("device %d still known to the driver after Close", d.ID)
	}
}

var errEarly = errors.New("I/O failed before the removal began")

// hammer does direct I/O on path until an operation fails, which it
// returns; a failure before closing is set wraps errEarly.
func hammer(path string, write bool, started chan<- struct{}, closing *atomic.Bool) error {
	once := sync.OnceFunc(func() { started <- struct{}{} })
	defer once()
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		return fmt.Errorf("%w: %v", errEarly, err)
	}
	defer f.Close()
	buf := alignedBuf(64 << 10)
	for i := 0; ; i++ {
		off := int64(i%100) * int64(len(buf)) // inside the 8 MiB device
		if write {
			_, err = f.WriteAt(buf, off)
		} else {
			_, err = f.ReadAt(buf, off)
		}
		if err != nil {
			if !closing.Load() {
				return fmt.Errorf("%w: op %d: %v", errEarly, i, err)
			}
			return err
		}
		if i == 10 {
			once()
		}
	}
}
