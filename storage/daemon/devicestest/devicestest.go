// Package devicestest is the conformance suite of client.Devices, in the
// style of containerd's snapshotter test suite: named checks, each on a
// fresh, empty daemon from the implementation's factory. The RPC client
// (*client.Client) and the in-process daemon (*daemon.Local) both run it,
// so code written against client.Devices behaves the same on either:
// device bytes through the NBD export, restack, shared devices, reclaim,
// the warm pool, rebase, and the error vocabulary (rpc.ErrNotFound, ErrConflict,
// ErrCapacity, ErrInvalid). RunShared checks each transport of shared
// memory exports (ublk, FUSE) the same way.
package devicestest

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentenv/agentenv/storage/daemon/client"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/image"
	"github.com/agentenv/agentenv/storage/nbd"
)

// Config is what a check needs of a fresh daemon.
type Config struct {
	// MaxDevices bounds device ids (0: the daemon's default).
	MaxDevices uint32
	// SharedBlock is the daemon's shared export kind (set by RunShared).
	SharedBlock string
}

// Factory starts a fresh daemon with an empty state directory and returns
// its Devices; it stops it at t's cleanup.
type Factory func(t *testing.T, cfg Config) client.Devices

// Size is the virtual size of the suite's image.
const Size = 4 << 20

// Image is a sealed one-layer image with known content.
type Image struct {
	Config string // image config path
	Layer  string
	Want   []byte
}

// NewImage writes a fresh image under t's temporary directory.
func NewImage(t *testing.T) *Image {
	t.Helper()
	dir := t.TempDir()
	im := &Image{Config: filepath.Join(dir, "image.json"), Layer: filepath.Join(dir, "base.lsmt"), Want: make([]byte, Size)}
	for i := range im.Want[:256<<10] {
		im.Want[i] = byte(i*7 + i>>9)
	}
	raw := filepath.Join(dir, "base.raw")
	if err := os.WriteFile(raw, im.Want, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := image.ImportRaw(context.Background(), raw, im.Layer, image.CommitOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := (&image.Config{Lowers: []image.LayerRef{{File: "base.lsmt"}}}).Save(im.Config); err != nil {
		t.Fatal(err)
	}
	return im
}

type check struct {
	name string
	cfg  Config
	fn   func(t *testing.T, ctx context.Context, d client.Devices, im *Image)
}

var checks = []check{
	{name: "Features", fn: checkFeatures},
	{name: "CreateReadWrite", fn: checkCreateReadWrite},
	{name: "CreateInvalid", fn: checkCreateInvalid},
	{name: "NotFound", fn: checkNotFound},
	{name: "DeleteRemovesExport", fn: checkDelete},
	{name: "RestackKeepsBytes", fn: checkRestack},
	{name: "RestackConflicts", fn: checkRestackConflicts},
	{name: "SealKeepingUpper", fn: checkSealKeep},
	{name: "SharedRefcount", fn: checkShared},
	{name: "Reclaim", fn: checkReclaim},
	{name: "Assign", fn: checkAssign},
	{name: "Rebase", fn: checkRebase},
	{name: "WarmPool", fn: checkWarmPool},
	{name: "Capacity", cfg: Config{MaxDevices: 2}, fn: checkCapacity},
	{name: "ConcurrentCreates", fn: checkConcurrent},
}

// Run runs every check against the implementation open makes.
func Run(t *testing.T, open Factory) {
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c.fn(t, ctx, open(t, c.cfg), NewImage(t))
		})
	}
}

// dial connects to a device's NBD export.
func dial(t *testing.T, ctx context.Context, dev rpc.Device) *nbd.Client {
	t.Helper()
	c, err := nbd.Dial(ctx, "unix", dev.Socket, dev.Export)
	if err != nil {
		t.Fatalf("dial device %d: %v", dev.ID, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func readAll(t *testing.T, r io.ReaderAt, n int64) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := r.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	return b
}

func mustCreate(t *testing.T, ctx context.Context, d client.Devices, p rpc.CreateParams) rpc.Device {
	t.Helper()
	dev, err := d.Create(ctx, p)
	if err != nil {
		t.Fatalf("create %+v: %v", p, err)
	}
	return dev
}

func mustList(t *testing.T, ctx context.Context, d client.Devices) []rpc.Device {
	t.Helper()
	devs, err := d.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return devs
}

func wantErr(t *testing.T, what string, err, sentinel error) {
	t.Helper()
	if !errors.Is(err, sentinel) {
		t.Errorf("%s: %v, want %v", what, err, sentinel)
	}
}
