package devicestest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/agentenv/agentenv/storage/daemon/client"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/ublk"
)

// Shared memory exports: the same checks for every transport a daemon can
// be started with to export shared read-only devices as a path the kernel
// pages from (rpc.BlockUblk, rpc.BlockFUSE). A daemon is started with
// Config.SharedBlock set to the transport.

var sharedChecks = []check{
	{name: "Features", fn: checkSharedFeatures},
	{name: "BytesThroughPath", fn: checkSharedPath},
	{name: "OtherKindsRefused", fn: checkSharedRefusals},
	{name: "Prefetch", fn: checkSharedPrefetch},
}

// RunShared runs the shared-export checks against daemons started with
// kind, skipping where this machine cannot serve it.
func RunShared(t *testing.T, kind string, open Factory) {
	switch kind {
	case rpc.BlockUblk:
		if err := ublk.Available(); err != nil {
			t.Skipf("ublk unavailable: %v", err)
		}
	case rpc.BlockFUSE:
		if os.Geteuid() != 0 {
			t.Skip("FUSE exports mount with mount(2): needs root")
		}
		if _, err := os.Stat("/dev/fuse"); err != nil {
			t.Skipf("no FUSE device: %v", err)
		}
	}
	for _, c := range sharedChecks {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c.cfg.SharedBlock = kind
			c.fn(t, ctx, open(t, c.cfg), NewImage(t))
		})
	}
}

// kindOf is the transport the daemon under test was started with.
func kindOf(t *testing.T, ctx context.Context, d client.Devices) string {
	t.Helper()
	f, err := d.Features(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return f.SharedBlock
}

func checkSharedFeatures(t *testing.T, ctx context.Context, d client.Devices, _ *Image) {
	f, err := d.Features(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if f.SharedBlock != rpc.BlockUblk && f.SharedBlock != rpc.BlockFUSE {
		t.Fatalf("features %+v: want a shared block kind", f)
	}
	if f.SharedBlock == rpc.BlockUblk && !f.Ublk {
		t.Errorf("features %+v: ublk shared exports without ublk", f)
	}
}

func checkSharedPath(t *testing.T, ctx context.Context, d client.Devices, im *Image) {
	kind := kindOf(t, ctx, d)
	a, err := d.Acquire(ctx, rpc.AcquireParams{Image: im.Config, Holder: "vm-a", Block: kind})
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.Acquire(ctx, rpc.AcquireParams{Image: im.Config, Holder: "vm-b", Block: kind})
	if err != nil {
		t.Fatal(err)
	}
	if a.ID != b.ID || b.Block != kind || b.BlockDevice == "" || !b.ReadOnly {
		t.Fatalf("two acquires of %s: %+v / %+v", kind, a, b)
	}
	// A VMM opens the path read-write (QEMU 7.2's memory backend does).
	f, err := os.OpenFile(b.BlockDevice, os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("open %s read-write: %v", b.BlockDevice, err)
	}
	got := make([]byte, Size)
	_, err = f.ReadAt(got, 0)
	if err != nil || !bytes.Equal(got, im.Want) {
		t.Fatalf("read %s: %v (equal %v)", b.BlockDevice, err, bytes.Equal(got, im.Want))
	}
	if _, err := f.WriteAt([]byte("x"), 0); err == nil {
		t.Errorf("a write to shared device %s succeeded", b.BlockDevice)
	}
	f.Close()
	for _, h := range []string{"vm-a", "vm-b"} {
		if err := d.ReleaseShared(ctx, a.ID, h); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(b.BlockDevice); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s after the last release: %v, want gone", b.BlockDevice, err)
	}
}

func checkSharedRefusals(t *testing.T, ctx context.Context, d client.Devices, im *Image) {
	kind := kindOf(t, ctx, d)
	other := rpc.BlockFUSE
	if kind == rpc.BlockFUSE {
		other = rpc.BlockUblk
	}
	_, err := d.Acquire(ctx, rpc.AcquireParams{Image: im.Config, Holder: "vm-a", Block: other})
	wantErr(t, "acquire of the kind not chosen at start", err, rpc.ErrInvalid)
	_, err = d.Create(ctx, rpc.CreateParams{Image: im.Config, ReadOnly: true, Block: rpc.BlockFUSE})
	wantErr(t, "create of a runtime device as a FUSE file", err, rpc.ErrInvalid)
}

func checkSharedPrefetch(t *testing.T, ctx context.Context, d client.Devices, im *Image) {
	kind := kindOf(t, ctx, d)
	dev, err := d.Acquire(ctx, rpc.AcquireParams{Image: im.Config, Holder: "vm-a", Block: kind})
	if err != nil {
		t.Fatal(err)
	}
	defer d.ReleaseShared(ctx, dev.ID, "vm-a")
	res, err := d.Prefetch(ctx, rpc.PrefetchParams{ID: dev.ID, Ranges: []rpc.ByteRange{{Off: 100, Len: 5000}, {Off: Size - 10, Len: 1 << 20}}})
	if kind != rpc.BlockFUSE {
		// Only FUSE files take pushed pages; a block device is refused.
		wantErr(t, "prefetch of a "+kind+" device", err, rpc.ErrInvalid)
		return
	}
	if err != nil || res.Stored != 2*4096+4096 { // two pages, then the last page (clipped)
		t.Fatalf("prefetch: %+v %v, want %d bytes stored", res, err, 3*4096)
	}
	_, err = d.Prefetch(ctx, rpc.PrefetchParams{ID: dev.ID, Ranges: []rpc.ByteRange{{Off: -1, Len: 1}}})
	wantErr(t, "a negative range", err, rpc.ErrInvalid)
	_, err = d.Prefetch(ctx, rpc.PrefetchParams{ID: dev.ID + 100})
	wantErr(t, "an unknown device", err, rpc.ErrNotFound)
	other := mustCreate(t, ctx, d, rpc.CreateParams{Image: im.Config})
	_, err = d.Prefetch(ctx, rpc.PrefetchParams{ID: other.ID})
	wantErr(t, "prefetch of a runtime device", err, rpc.ErrInvalid)
}
