package disk

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/kernellane"
	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/storage/daemon"
	"github.com/agentenv/agentenv/storage/daemon/client"
	"github.com/agentenv/agentenv/storage/daemon/daemontest"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/memfs/memfstest"
	"github.com/agentenv/agentenv/storage/nbd"
	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/vmm/memsnap"
	"github.com/agentenv/agentenv/vmm/qemu"
)

// fileDriver is a driver that maps memory files only (no
// MapsDeviceMemory), for the choice below.
type fileDriver struct{ vmm.Driver }

func (fileDriver) Name() string { return "files-only" }

// TestMemoryDevicesChoice: memory devices only with ublk disks or a daemon
// exporting shared memory over FUSE, and a VMM that maps devices; the
// reason otherwise names what is missing.
func TestMemoryDevicesChoice(t *testing.T) {
	sd := &client.Client{}
	q := &qemu.Driver{}
	for _, c := range []struct {
		sd            sharedDevices
		block, shared string
		drv           vmm.Driver
		want          string
		why           string
	}{
		{sd, rpc.BlockUblk, rpc.BlockUblk, q, rpc.BlockUblk, ""},
		{sd, rpc.BlockUblk, "", q, rpc.BlockUblk, ""}, // a daemon that does not report its choice
		{sd, rpc.BlockNBD, "", q, "", "no ublk devices"},
		{sd, rpc.BlockNone, "", q, "", "no ublk devices"},
		{sd, rpc.BlockNone, rpc.BlockFUSE, q, rpc.BlockFUSE, ""},
		{sd, rpc.BlockUblk, rpc.BlockFUSE, q, rpc.BlockFUSE, ""},
		{sd, rpc.BlockUblk, "", fileDriver{}, "", "maps files only"},
		{sd, rpc.BlockNone, rpc.BlockFUSE, fileDriver{}, "", "maps files only"},
	} {
		d, why := newMemoryDevices(c.sd, c.block, c.shared, c.drv, nil, slog.Default())
		kind := ""
		if d != nil {
			kind = d.Kind()
		}
		if kind != c.want || !strings.Contains(why, c.why) {
			t.Errorf("block %q, shared %q, driver %T: devices %q (%q), want %q (%q)", c.block, c.shared, c.drv, kind, why, c.want, c.why)
		}
	}
}

// TestStackConfigFollowsManifest: a stack's config is written once per
// snapshot directory, and replaced when it lists other layers than the
// directory's manifest (a directory linked from a paused sandbox's).
func TestStackConfigFollowsManifest(t *testing.T) {
	d := &MemoryDevices{log: slog.Default()}
	dir := t.TempDir()
	first := []string{"/data/t/mem-0.lsmt", "/data/s/mem-3.lsmt"}
	cfg, err := d.config(dir, first)
	if err != nil || !listsLayers(cfg, first) {
		t.Fatalf("config %s (%v): want it to list %v", cfg, err, first)
	}
	st, _ := os.Stat(cfg)
	if again, err := d.config(dir, first); err != nil || again != cfg {
		t.Fatalf("second config: %s, %v", again, err)
	}
	if st2, _ := os.Stat(cfg); !st2.ModTime().Equal(st.ModTime()) || !os.SameFile(st, st2) {
		t.Fatal("the config was rewritten for the same layers: the daemon would see a new image")
	}
	adopted := []string{"/data/t/mem-0.lsmt", "/data/snap/mem-3.lsmt"}
	if _, err := d.config(dir, adopted); err != nil || !listsLayers(cfg, adopted) || listsLayers(cfg, first) {
		t.Fatalf("a config listing other layers was kept (%v)", err)
	}
	if listsLayers(cfg, adopted[:1]) || listsLayers(filepath.Join(dir, "missing.json"), adopted) {
		t.Fatal("listsLayers: a prefix or a missing config matched")
	}
}

// TestMemoryDevicesLane runs TestMemoryDevices inside the kernel lane.
func TestMemoryDevicesLane(t *testing.T) {
	kernellane.RunTests(t, kernellane.Options{Run: "^TestMemoryDevices$", Modules: []string{"ublk_drv"}}, "TestMemoryDevices")
}

// TestMemoryDevices (inside the lane, against a real daemon with ublk):
// two VMs restored from one snapshot get one shared read-only device of its
// memory stack, which reads as the stack flattened; the stack's config is
// written once; a restart finds an adopted VM's hold and gives back holds no
// VM has; the last release removes the device.
func TestMemoryDevices(t *testing.T) {
	if !kernellane.InGuest() {
		t.Skip("the host kernel has no ublk driver: this half runs inside the kernel lane, which TestMemoryDevicesLane boots")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := daemontest.Start(ctx, t)
	f, err := c.Features(ctx)
	if err != nil || !f.Ublk {
		t.Fatalf("features %+v, %v: want ublk inside the lane", f, err)
	}
	d, why := newMemoryDevices(c, rpc.ChooseBlock(f, true), f.SharedBlock, &qemu.Driver{}, nil, slog.Default())
	if d == nil || d.Kind() != rpc.BlockUblk {
		t.Fatalf("no ublk memory devices with ublk: %s", why)
	}
	checkMemoryDevices(ctx, t, c, d)
}

// TestMemoryDevicesFUSE is TestMemoryDevices against a daemon started to
// export shared memory as FUSE files (no ublk needed).
func TestMemoryDevicesFUSE(t *testing.T) {
	memfstest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := daemontest.StartWith(ctx, t, func(o *daemon.Options) { o.SharedBlock = rpc.BlockFUSE })
	f, err := c.Features(ctx)
	if err != nil || f.SharedBlock != rpc.BlockFUSE {
		t.Fatalf("features %+v, %v: want FUSE shared exports", f, err)
	}
	d, why := newMemoryDevices(c, rpc.ChooseBlock(f, true), f.SharedBlock, &qemu.Driver{}, nil, slog.Default())
	if d == nil || d.Kind() != rpc.BlockFUSE {
		t.Fatalf("no FUSE memory devices: %s", why)
	}
	checkMemoryDevices(ctx, t, c, d)
}

// checkMemoryDevices is the body of TestMemoryDevices for either kind.
func checkMemoryDevices(ctx context.Context, t *testing.T, c *client.Client, d *MemoryDevices) {
	vmDir, m := memoryStack(ctx, t, c)

	m1, vm1, err := d.Acquire(ctx, vmDir, m, "a-1")
	if err != nil {
		t.Fatal(err)
	}
	cfgInfo, err := os.Stat(filepath.Join(vmDir, stackConfig))
	if err != nil {
		t.Fatal(err)
	}
	_, vm2, err := d.Acquire(ctx, vmDir, m, "b-1")
	if err != nil {
		t.Fatal(err)
	}
	if again, err := os.Stat(filepath.Join(vmDir, stackConfig)); err != nil || !again.ModTime().Equal(cfgInfo.ModTime()) {
		t.Fatalf("the stack config was rewritten by the second acquire (%v)", err)
	}
	if !IsDevice(vm1.File) || vm1.File != vm2.File || m1.File != vm1.File || len(vm1.Layers) != 0 || vm1.Release == nil {
		t.Fatalf("VMs map %q and %q (image file %q, layers %v): want one device, no layers to write", vm1.File, vm2.File, m1.File, vm1.Layers)
	}
	if !slices.Equal(m1.Layers, m.Layers) {
		t.Fatalf("the image's layers became %v, want %v (a pause's diff stacks on them)", m1.Layers, m.Layers)
	}
	flat := filepath.Join(t.TempDir(), "flat")
	if err := memsnap.Materialize(ctx, m.Layers, flat); err != nil {
		t.Fatal(err)
	}
	if daemontest.SumFile(t, vm1.File) != daemontest.SumFile(t, flat) {
		t.Fatalf("%s does not read as the stack flattened", vm1.File)
	}

	// The stack's working set is kept next to its config and pushed into
	// the page cache for the next VM; one that does not fit the file is
	// refused.
	ws, err := d.WorkingSetPath(ctx, vm1.File)
	if _, errElse := d.WorkingSetPath(ctx, "/elsewhere"); err != nil || errElse == nil ||
		ws != filepath.Join(vmDir, snapshot.WorkingSetFile) {
		t.Fatalf("working set of %s kept at %q (%v); of a file no device exports: %v", vm1.File, ws, err, errElse)
	}
	if _, err := d.Prefetch(ctx, vm1.File); !errors.Is(err, memsnap.ErrNoWorkingSet) {
		t.Fatalf("prefetch without a working set: %v", err)
	}
	if err := memsnap.WriteWorkingSetTo(ws, vm1.File, []memsnap.Extent{{Off: 0, Len: 8192}, {Off: 3 * 4096, Len: 4096}}); err != nil {
		t.Fatal(err)
	}
	if n, err := d.Prefetch(ctx, vm1.File); err != nil || n != 3*4096 {
		t.Fatalf("prefetch of a 3-page working set: %d bytes, %v", n, err)
	}
	if err := os.WriteFile(ws, []byte(`{"size":4194304,"extents":[{"off":4190208,"len":8192}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Prefetch(ctx, vm1.File); err == nil || !strings.Contains(err.Error(), "outside the file") {
		t.Fatalf("prefetch of a working set past the file's end: %v", err)
	}
	if d.kind == rpc.BlockFUSE {
		checkPack(ctx, t, d, vm1.File, vmDir, m.Layers, flat)
	}

	// A restart: "a-1" runs on (adopted), "b-1" is gone.
	if d.Adopted(ctx, vm1.File, "a-1") == nil || d.Adopted(ctx, vm1.File, "gone-1") != nil {
		t.Fatal("adopted: want the hold of a-1 found and none for a holder without one")
	}
	d.ReleaseUnheld(ctx, func(h string) bool { return h == "a-1" })
	if dev := sharedDevice(ctx, t, c, vm1.File); dev == nil || !slices.Equal(dev.Holders, []string{"a-1"}) {
		t.Fatalf("after releasing holds no VM has: %+v, want held by a-1 only", dev)
	}
	vm1.Release(ctx)
	if dev := sharedDevice(ctx, t, c, vm1.File); dev != nil {
		t.Fatalf("after the last release: %+v, want no device", dev)
	}
}

// memoryStack makes a snapshot directory whose manifest names a two-layer
// memory image (a base imported from a 4 MiB RAM file, and a layer sealed
// over it by the daemon after some pages changed), as pauses leave them.
func memoryStack(ctx context.Context, t *testing.T, c *client.Client) (string, snapshot.MemoryImage) {
	t.Helper()
	dir := t.TempDir()
	ram := make([]byte, 4<<20)
	rand.NewChaCha8([32]byte{3}).Read(ram)
	raw := filepath.Join(dir, "ram")
	if err := os.WriteFile(raw, ram, 0o600); err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(dir, "mem-0.lsmt")
	if _, err := memsnap.ImportFull(ctx, raw, base, "test memory"); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "base.json")
	if err := snapshot.WriteImageConfig(cfg, []string{base}); err != nil {
		t.Fatal(err)
	}
	dev, err := c.Create(ctx, rpc.CreateParams{Image: cfg, Owner: "stack"})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nbd.Dial(ctx, "unix", dev.Socket, dev.Export)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.WriteAt([]byte("a page the guest wrote"), 3*4096); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	res, err := c.Restack(ctx, rpc.RestackParams{ID: dev.ID, Message: "pause"})
	if err != nil {
		t.Fatal(err)
	}
	// The sealed layer lies in the device's own directory, which goes
	// with the device: the stack keeps a copy (a pause's lies in the
	// sandbox's directory).
	layer := filepath.Join(dir, "mem-1.lsmt")
	if b, err := os.ReadFile(res.Layer); err != nil || os.WriteFile(layer, b, 0o600) != nil {
		t.Fatalf("copy the sealed layer: %v", err)
	}
	if err := c.Delete(ctx, dev.ID); err != nil {
		t.Fatal(err)
	}
	vmDir := filepath.Join(dir, "snapshot-1")
	m := snapshot.MemoryImage{Layers: []string{base, layer}, File: filepath.Join(vmDir, snapshot.FlatMemory), Base: raw}
	if err := os.MkdirAll(vmDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := snapshot.WriteMemoryManifest(vmDir, m); err != nil {
		t.Fatal(err)
	}
	return vmDir, m
}

// sharedDevice returns the daemon's shared device at path, or nil.
func sharedDevice(ctx context.Context, t *testing.T, c *client.Client, path string) *rpc.Device {
	t.Helper()
	devs, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		if d.Kind == rpc.KindShared && d.BlockDevice == path {
			return &d
		}
	}
	return nil
}

// TestIsDevice: block devices and the daemon's FUSE memory files are
// shared devices; flattened files and look-alikes are not.
func TestIsDevice(t *testing.T) {
	for path, want := range map[string]bool{
		"/dev/ublkb3":                        true,
		"/run/aenv-storaged/mem/aenv-7-3f2a": true,
		"/data/snapshots/s/memory.flat":      false,
		"/data/mem/memory.flat":              false,
		"mem/aenv-7-3f2a":                    false,
		"/run/aenv-storaged/aenv-7-3f2a":     false,
	} {
		if got := IsDevice(path); got != want {
			t.Errorf("IsDevice(%q) = %v, want %v", path, got, want)
		}
	}
}

// checkPack: a FUSE export whose stack has a working-set pack has the
// pack's bytes stored (what the file then reads there); a pack of another
// file is refused and the working set read through the export instead.
func checkPack(ctx context.Context, t *testing.T, d *MemoryDevices, file, vmDir string, layers []string, flat string) {
	t.Helper()
	size, err := memsnap.SizeOf(file)
	if err != nil {
		t.Fatal(err)
	}
	packFile := filepath.Join(vmDir, snapshot.WorkingSetPackFile)
	writePack := func() {
		ws, _ := json.Marshal(map[string]any{"size": size, "extents": []memsnap.Extent{{Off: 4096, Len: 4 * 4096}, {Off: 1 << 20, Len: 4096}}})
		f, err := os.Create(packFile)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := memsnap.WritePack(ctx, f, layers, ws); err != nil {
			t.Fatal(err)
		}
	}
	writePack()
	if n, err := d.Prefetch(ctx, file); err != nil || n != 5*4096 {
		t.Fatalf("prefetch from a pack of 5 pages: %d bytes, %v", n, err)
	}
	if daemontest.SumFile(t, file) != daemontest.SumFile(t, flat) {
		t.Fatalf("%s does not read as the stack flattened after its pack was stored", file)
	}
	if err := os.WriteFile(packFile, []byte("AENVWSP1 not a pack"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := memsnap.WriteWorkingSetTo(filepath.Join(vmDir, snapshot.WorkingSetFile), file, []memsnap.Extent{{Off: 0, Len: 4096}}); err != nil {
		t.Fatal(err)
	}
	if n, err := d.Prefetch(ctx, file); n != 4096 || err == nil || !strings.Contains(err.Error(), snapshot.WorkingSetPackFile) {
		t.Fatalf("prefetch with a damaged pack: %d bytes, %v; want the working set read through the export and the pack named", n, err)
	}
	if err := os.Remove(packFile); err != nil {
		t.Fatal(err)
	}
}
