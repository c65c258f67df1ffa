package vmtest

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/kernellane"
	"github.com/agentenv/agentenv/internal/testenv"
	"github.com/agentenv/agentenv/storage/daemon"
	"github.com/agentenv/agentenv/storage/daemon/client"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/image"
	"github.com/agentenv/agentenv/storage/memfs/memfstest"
	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/vmm/memsnap"
	"github.com/agentenv/agentenv/vmm/qemu"
)

// TestQEMUOnFUSEMemory runs on the host (no ublk needed): the probe guest
// boots on an NBD disk of the daemon, is snapshotted without its RAM, and
// its RAM becomes a memory layer; two guests are then restored from the
// snapshot with their memory mapped privately (memory-backend-file,
// share=off) from the daemon's read-only FUSE file of that layer stack.
// Both run on it (their counters go on), the second adds no FUSE read
// (the page cache is shared), and the file still reads as the stack.
func TestQEMUOnFUSEMemory(t *testing.T) {
	memfstest.Require(t)
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		testenv.Missing(t, "qemu-system-x86_64 not installed (qemu-system-x86): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	dir := t.TempDir()
	kernel, initrd := probeGuest(ctx, t)
	dmn, c := startFUSEDaemon(ctx, t, dir)
	disk, want := probeDisk(ctx, t, dir)
	d, err := qemu.New(ctx, qemu.Options{ProbeKernel: kernel})
	if err != nil {
		t.Fatal(err)
	}
	p := &probeRun{t: t, ctx: ctx, c: c, d: d, disk: disk, dir: dir}

	sum, snap, base, tick := p.bootSnapshot(kernel, initrd)
	if sum != fmt.Sprintf("%x", sha256.Sum256(want[:1<<20])) {
		t.Fatalf("the guest read %s from its disk, want the image's first MiB", sum)
	}

	memA, memB := p.sharedFile([]string{base}, "vm2"), p.sharedFile([]string{base}, "vm3")
	if memA.ID != memB.ID || memA.BlockDevice != memB.BlockDevice || !filepath.IsAbs(memA.BlockDevice) {
		t.Fatalf("two holders of one stack: %+v / %+v, want one file", memA, memB)
	}
	vm2 := p.restoreOn("vm2", snap, memA.BlockDevice)
	p.waitTickAbove(vm2, tick+2)
	if err := vm2.Pause(ctx); err != nil { // its faults stop: what follows is vm3's
		t.Fatal(err)
	}
	first, _ := dmn.SharedFileStats()
	if first.Reads == 0 || first.ReadErrs != 0 {
		t.Fatalf("after the first guest ran: %+v, want FUSE reads and no errors", first)
	}
	vm3 := p.restoreOn("vm3", snap, memA.BlockDevice)
	p.waitTickAbove(vm3, tick+1)
	second, _ := dmn.SharedFileStats()
	t.Logf("FUSE reads: %d (%d MiB) for the first guest, %d more for the second", first.Reads, first.ReadBytes>>20, second.Reads-first.Reads)
	if second.Reads != first.Reads || second.ReadErrs != 0 {
		t.Errorf("the second guest on the same file took %d FUSE reads (%d errors), want 0: the page cache is not shared",
			second.Reads-first.Reads, second.ReadErrs)
	}
	if err := vm2.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	p.waitTickAbove(vm2, p.lastTick(vm2)) // vm2 goes on after vm3 started
	vm2.Stop(ctx)
	vm3.Stop(ctx)
	p.checkDeviceHolds(memA.BlockDevice, []string{base}) // private writes left the file as it was
}

// probeGuest builds the probe guest's initramfs (diskprobe as init) and
// returns the kernel and initramfs paths.
func probeGuest(ctx context.Context, t *testing.T) (string, string) {
	t.Helper()
	if err := kernellane.Unavailable(); err != nil {
		testenv.Missing(t, "%v", err)
	}
	probe := filepath.Join(t.TempDir(), "diskprobe")
	build := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", probe, "./diskprobe")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build diskprobe: %v\n%s", err, out)
	}
	initrd, k, err := kernellane.Initramfs(ctx, kernellane.Options{Run: "probe", Binary: probe, Modules: []string{"virtio_mmio", "virtio_blk"}})
	if errors.Is(err, kernellane.ErrNoKernel) {
		testenv.Missing(t, "%v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return k.Vmlinuz, initrd
}

// startFUSEDaemon runs a daemon exporting shared memory over FUSE in this
// process (QEMU, another process, is the only one mapping its files).
func startFUSEDaemon(ctx context.Context, t *testing.T, dir string) (*daemon.Daemon, *client.Client) {
	t.Helper()
	opts := daemon.Options{
		Socket: filepath.Join(dir, "storaged.sock"), StateDir: filepath.Join(dir, "state"), RunDir: filepath.Join(dir, "run"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), SharedBlock: rpc.BlockFUSE,
	}
	dmn, err := daemon.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- dmn.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })
	for {
		c, err := client.Dial(ctx, opts.Socket)
		if err == nil {
			t.Cleanup(func() { c.Close() })
			return dmn, c
		}
		select {
		case err := <-done:
			t.Fatalf("storage daemon exited: %v", err)
		case <-ctx.Done():
			t.Fatal("storage daemon did not come up")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// nbdDisk creates a writable device of the disk image, reached over its
// NBD socket (one per VM: QEMU locks an image it writes).
func (p *probeRun) nbdDisk() vmm.Drive {
	p.t.Helper()
	dev, err := p.c.Create(p.ctx, rpc.CreateParams{Image: p.disk, Owner: "probe"})
	if err != nil {
		p.t.Fatal(err)
	}
	return vmm.Drive{ID: "rootfs", NBD: &vmm.NBDSource{Socket: dev.Socket, Export: dev.Export}}
}

// sharedFile acquires the FUSE file of a memory stack for holder.
func (p *probeRun) sharedFile(layers []string, holder string) rpc.Device {
	p.t.Helper()
	cfg := filepath.Join(p.dir, fmt.Sprintf("mem-%d.json", len(layers)))
	if _, err := os.Stat(cfg); err != nil {
		if err := writeStackConfig(cfg, layers); err != nil {
			p.t.Fatal(err)
		}
	}
	dev, err := p.c.Acquire(p.ctx, rpc.AcquireParams{Image: cfg, Holder: holder, Block: rpc.BlockFUSE})
	if err != nil {
		p.t.Fatal(err)
	}
	if dev.Block != rpc.BlockFUSE {
		p.t.Fatalf("device %+v: want a FUSE file", dev)
	}
	return dev
}

// restoreOn restores the probe from snap with its memory mapped from file.
func (p *probeRun) restoreOn(id, snap, file string) vmm.Machine {
	p.t.Helper()
	vm, err := p.d.Restore(p.ctx, vmm.RestoreConfig{ID: id, SnapshotDir: snap, MemoryFile: file,
		Drives: []vmm.Drive{p.nbdDisk()}, RunDir: filepath.Join(p.dir, "run-"+id)})
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { vm.Stop(context.Background()) })
	return vm
}

// writeStackConfig writes the image config of a memory layer stack.
func writeStackConfig(path string, layers []string) error {
	ic := &image.Config{}
	for _, l := range layers {
		ic.Lowers = append(ic.Lowers, image.LayerRef{File: l})
	}
	return ic.Save(path)
}

// bootSnapshot boots the probe guest on p's disk, snapshots it once it
// ticks and imports its memory as the base layer (dir/mem-0.lsmt), then
// stops it: it returns the checksum the guest read from its disk, the
// snapshot, the base layer and the guest's last tick.
func (p *probeRun) bootSnapshot(kernel, initrd string) (sum, snap, base string, tick int) {
	p.t.Helper()
	vm, err := p.d.Boot(p.ctx, vmm.Config{ID: "probe", Kernel: kernel, Initrd: initrd, MemoryMiB: 96,
		RunDir: filepath.Join(p.dir, "run-boot"), Cmdline: "quiet", Drives: []vmm.Drive{p.nbdDisk()}})
	if err != nil {
		p.t.Fatal(err)
	}
	defer vm.Stop(context.Background())
	sum = p.waitLine(vm, `DISKPROBE sha256 ([0-9a-f]+)`)
	p.waitTickAbove(vm, 0)
	snap = p.snapshot(vm, "snap1")
	base = filepath.Join(p.dir, "mem-0.lsmt")
	if _, err := memsnap.ImportFull(p.ctx, vm.Info().MemoryFile, base, "probe memory"); err != nil {
		p.t.Fatal(err)
	}
	return sum, snap, base, p.lastTick(vm)
}
