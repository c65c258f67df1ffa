package daemon

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/memfs"
	"github.com/agentenv/agentenv/storage/memfs/memfstest"
	"github.com/agentenv/agentenv/storage/ublk"
)

// TestChooseShared: the shared export kind follows the option and the
// machine, and an impossible or unknown choice is an error at start.
func TestChooseShared(t *testing.T) {
	ublkErr := ublk.Available()
	kind, _, err := chooseShared(SharedDefault)
	if err != nil || (ublkErr == nil) != (kind == rpc.BlockUblk) || (ublkErr != nil && kind != rpc.BlockNone) {
		t.Errorf("default: %q %v (ublk: %v)", kind, err, ublkErr)
	}
	kind, _, err = chooseShared(SharedAuto)
	if _, fuseErr := os.Stat("/dev/fuse"); err != nil || (ublkErr == nil && kind != rpc.BlockUblk) ||
		(ublkErr != nil && fuseErr == nil && kind != rpc.BlockFUSE) {
		t.Errorf("auto: %q %v (ublk: %v)", kind, err, ublkErr)
	}
	if _, _, err := chooseShared(rpc.BlockUblk); (err == nil) != (ublkErr == nil) {
		t.Errorf("ublk: %v (ublk: %v)", err, ublkErr)
	}
	if _, _, err := chooseShared("nfs"); err == nil {
		t.Error("an unknown kind was accepted")
	}
	if kind, _, err := chooseShared(SharedNone); err != nil || kind != rpc.BlockNone {
		t.Errorf("none: %q %v", kind, err)
	}
}

// TestFUSESharedAcrossRestart: a daemon started with FUSE shared exports
// serves a shared device as a file on RUN/mem, unmounts on stop, detaches
// a mount left there, and re-exports the device at the same path when it
// starts again.
func TestFUSESharedAcrossRestart(t *testing.T) {
	memfstest.Require(t)
	t.Parallel()
	f := newFixture(t, 40)
	opts := testOptions(t)
	opts.SharedBlock = rpc.BlockFUSE
	// A mount another server left on the mount point (a daemon killed
	// before it unmounted) is detached by the next start.
	left, err := memfs.Mount(opts.RunDir+"/mem", memfs.Options{Logger: opts.Logger})
	if err != nil {
		t.Fatal(err)
	}
	defer left.Close()
	h := start(t, opts)
	ctx := ctxT(t)
	dev, err := h.c.Acquire(ctx, rpc.AcquireParams{Image: f.config, Holder: "vm", Block: rpc.BlockFUSE})
	if err != nil {
		t.Fatal(err)
	}
	readFile(t, dev.BlockDevice, f.want)
	h.stop()
	if ok, err := memfs.Mounted(opts.RunDir + "/mem"); err != nil || ok {
		t.Fatalf("mount after stop: %v %v", ok, err)
	}

	h = start(t, opts)
	defer h.stop()
	devs, err := h.c.List(ctx)
	if err != nil || len(devs) != 1 || devs[0].State != rpc.StateActive || devs[0].BlockDevice != dev.BlockDevice {
		t.Fatalf("after restart: %+v %v, want %s active", devs, err, dev.BlockDevice)
	}
	readFile(t, dev.BlockDevice, f.want)
	if err := h.c.ReleaseShared(ctx, dev.ID, "vm"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dev.BlockDevice); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("file after the last release: %v", err)
	}
}

func readFile(t *testing.T, path string, want []byte) {
	t.Helper()
	got, err := os.ReadFile(path)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("read %s: %v (equal %v)", path, err, bytes.Equal(got, want))
	}
}

// TestAutoWithoutAFUSEMount: asked for whatever works (auto), a daemon
// whose FUSE mount cannot be made starts without shared exports (and says
// so in its features); asked for FUSE, it refuses to start.
func TestAutoWithoutAFUSEMount(t *testing.T) {
	if ublk.Available() == nil {
		t.Skip("the ublk driver is loaded: auto picks ublk, no FUSE mount is tried")
	}
	broken := func() Options {
		opts := testOptions(t)
		// The mount point is a file: the mount cannot be made.
		if err := os.MkdirAll(opts.RunDir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(opts.RunDir+"/"+rpc.SharedFileDir, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		return opts
	}
	opts := broken()
	opts.SharedBlock = SharedAuto
	h := start(t, opts)
	if f, err := h.c.Features(ctxT(t)); err != nil || f.SharedBlock != rpc.BlockNone {
		t.Fatalf("auto without a FUSE mount: features %+v, %v; want no shared exports", f, err)
	}
	opts = broken()
	opts.SharedBlock = rpc.BlockFUSE
	d, err := New(opts)
	if err == nil {
		err = d.Run(t.Context())
	}
	if err == nil || !strings.Contains(err.Error(), "FUSE") {
		t.Fatalf("FUSE asked for without a mount: %v", err)
	}
}
