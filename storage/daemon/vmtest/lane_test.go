package vmtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/kernellane"
	"github.com/agentenv/agentenv/internal/testenv"
	"github.com/agentenv/agentenv/storage/daemon/client"
	"github.com/agentenv/agentenv/storage/daemon/daemontest"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/image"
	"github.com/agentenv/agentenv/storage/nbd"
	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/vmm/memsnap"
	"github.com/agentenv/agentenv/vmm/qemu"
)

// The guest kernel and initramfs of the probe VM, at these paths inside the
// lane (named in the lane's environment).
const (
	envProbeKernel = "AENV_PROBE_KERNEL"
	envProbeInitrd = "AENV_PROBE_INITRD"
	// envProbeMemory=file restores the guests from their memory stack
	// flattened into a file instead of the daemon's device (the daemon's
	// devices are still made and checked): it tells a crash of the
	// emulation from one of the device.
	envProbeMemory = "AENV_PROBE_MEMORY"
	// envLaneRestores=1 runs the restores of TestQEMUOnKernelDevices, which
	// crash in about one run of three for a reason outside the code they
	// check (docs/ublk.md, "QEMU on the devices"); the boot always runs.
	envLaneRestores = "AENV_LANE_QEMU"
)

// qemuFiles are what qemu-system-x86_64 loads besides its libraries for a
// microvm machine under TCG: the firmware and Debian's TCG module.
var qemuFiles = []string{"/usr/share/qemu/bios-microvm.bin", "/usr/lib/x86_64-linux-gnu/qemu/accel-tcg-x86_64.so"}

// TestQEMUOnKernelDevicesLane runs TestQEMUOnKernelDevices inside the kernel
// lane, with QEMU, a guest kernel and the probe guest's initramfs
// (laneinit running diskprobe) packed into it.
func TestQEMUOnKernelDevicesLane(t *testing.T) {
	if err := kernellane.Unavailable(); err != nil {
		testenv.Missing(t, "%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
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
	files := map[string]string{"lane/probe/vmlinuz": k.Vmlinuz, "lane/probe/initrd": initrd}
	env := []string{envProbeKernel + "=/lane/probe/vmlinuz", envProbeInitrd + "=/lane/probe/initrd", "AENV_QEMU_ACCEL=tcg"}
	if os.Getenv(envLaneRestores) == "1" {
		env = append(env, envLaneRestores+"=1")
	} else {
		t.Logf("the restores of the nested guest are skipped: set %s=1 to run them (docs/ublk.md)", envLaneRestores)
	}
	if m := os.Getenv(envProbeMemory); m != "" {
		env = append(env, envProbeMemory+"="+m)
	}
	for _, f := range qemuFiles {
		files[f] = f
	}
	kernellane.RunTests(t, kernellane.Options{
		Run: "^TestQEMUOnKernelDevices$", Programs: []string{"/usr/bin/qemu-system-x86_64"}, Files: files,
		Env:     env,
		Modules: []string{"ublk_drv"}, MemoryMiB: 4096, Timeout: 9 * time.Minute,
	}, "TestQEMUOnKernelDevices")
}

// TestQEMUOnKernelDevices (inside the lane) runs QEMU through the node's
// driver on kernel block devices of the storage daemon, as a node with ublk
// does: the guest's disk is a ublk device (QEMU opens the path; no NBD
// socket), and restored guests map their memory privately from the
// daemon's shared read-only ublk device of a memory layer stack (no
// flattened file). It checks the bytes the guest reads and writes, that
// restored guests run on that memory (their counters go on), that a pause
// captures the pages they wrote as a layer over the device, and that two
// guests restored from one device leave it unchanged. The restores are a
// subtest that runs only with envLaneRestores set.
func TestQEMUOnKernelDevices(t *testing.T) {
	if !kernellane.InGuest() {
		t.Skip("the host kernel has no ublk driver: this half runs inside the kernel lane, which TestQEMUOnKernelDevicesLane boots")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	dir := t.TempDir()
	c := daemontest.Start(ctx, t)
	disk, want := probeDisk(ctx, t, dir)
	d, err := qemu.New(ctx, qemu.Options{ProbeKernel: os.Getenv(envProbeKernel)})
	if err != nil {
		t.Fatal(err)
	}
	p := &probeRun{t: t, ctx: ctx, c: c, d: d, disk: disk, dir: dir}

	// 1. Boot on a ublk disk: the guest reads the image and writes a marker
	// that reaches the daemon.
	dev := p.device()
	vm, err := d.Boot(ctx, vmm.Config{ID: "probe", Kernel: os.Getenv(envProbeKernel), Initrd: os.Getenv(envProbeInitrd),
		MemoryMiB: 96, RunDir: filepath.Join(dir, "run-boot"), Cmdline: "quiet",
		Drives: []vmm.Drive{{ID: "rootfs", Path: dev.BlockDevice}}})
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Stop(context.Background())
	if got := p.waitLine(vm, `DISKPROBE sha256 ([0-9a-f]+)`); got != fmt.Sprintf("%x", sha256.Sum256(want[:1<<20])) {
		t.Fatalf("the guest read %s from its ublk disk, want the image's first MiB", got)
	}
	p.waitLine(vm, `DISKPROBE (flushed)`)
	p.checkMarker(dev)
	p.waitTickAbove(vm, 0)

	// 2-4 restore it, with its memory mapped privately from a device.
	t.Run("restores", func(t *testing.T) {
		if os.Getenv(envLaneRestores) != "1" {
			// Not a missing part: a known failure outside the code under
			// test (docs/ublk.md, "QEMU on the devices").
			t.Skip("set " + envLaneRestores + "=1 to run them: a nested guest restored from a private mapping (device or file alike) " +
				"crashes in about one run of three (SIGSEGV or a double fault right after its restore, under TCG inside TCG)")
		}
		p.t = t
		p.restores(vm)
	})
}

// restores runs steps 2-4 of TestQEMUOnKernelDevices on the booted VM.
func (p *probeRun) restores(vm vmm.Machine) {
	t, ctx, c, dir := p.t, p.ctx, p.c, p.dir
	// 2. Snapshot without RAM; the booted VM's RAM file becomes the base
	// memory layer.
	snap1 := p.snapshot(vm, "snap1")
	base := filepath.Join(dir, "mem-0.lsmt")
	if _, err := memsnap.ImportFull(ctx, vm.Info().MemoryFile, base, "probe memory"); err != nil {
		t.Fatal(err)
	}
	tick1 := p.lastTick(vm)
	vm.Stop(ctx)

	// 3. Restore from the shared device of [base]: the guest goes on
	// counting; a pause captures what it wrote as a layer over the device.
	mem0 := p.shared([]string{base}, "vm2")
	vm2 := p.restore("vm2", snap1, mem0, nil)
	p.waitTickAbove(vm2, tick1)
	snap2 := p.snapshot(vm2, "snap2")
	layer := filepath.Join(dir, "mem-1.lsmt")
	parent, err := memsnap.LayerUUID(base)
	if err != nil {
		t.Fatal(err)
	}
	st, err := memsnap.CaptureDiff(ctx, vm2.Info().PID, p.mapped(mem0), layer, parent, "probe pause")
	if err != nil || st.Pages+st.ZeroPages == 0 {
		t.Fatalf("capture over the memory device: %+v, %v (want the pages the guest wrote)", st, err)
	}
	p.checkGuestRAM(vm2, p.mapped(mem0), []string{base, layer})
	tick2 := p.lastTick(vm2)
	vm2.Stop(ctx)
	if err := c.ReleaseShared(ctx, mem0.ID, "vm2"); err != nil {
		t.Fatal(err)
	}
	delete(p.flat, mem0.BlockDevice) // the path may name the next device

	// 4. Two guests from one shared device of [base, layer] both go on
	// from the pause; the device keeps the stack's bytes.
	stack := []string{base, layer}
	mem1, mem1b := p.shared(stack, "vm3"), p.shared(stack, "vm4")
	if mem1.ID != mem1b.ID || mem1.BlockDevice != mem1b.BlockDevice {
		t.Fatalf("two holders of one stack got devices %d (%s) and %d (%s), want one", mem1.ID, mem1.BlockDevice, mem1b.ID, mem1b.BlockDevice)
	}
	p.t.Logf("memory devices: %s for [base], %s for [base layer]", mem0.BlockDevice, mem1.BlockDevice)
	p.checkDeviceHolds(mem1.BlockDevice, stack) // before any guest maps it
	// vm4 runs confined, as the node runs its VMMs: it opens its disk and
	// memory device before it drops to its own uid in its jail. It starts
	// once vm3 runs, and both go on together. With both started at once and
	// 2 GiB for the lane (whose files also live in its RAM), a nested guest
	// crashed in about one run of four (a double fault with garbage flags in
	// a slab fast path, a probe's SIGSEGV at a syscall instruction; once vm3
	// as vm4 started) while the guest's RAM and the device checked exact:
	// the emulation, TCG inside TCG, not the memory the guest was given.
	vm3 := p.restore("vm3", snap2, mem1, nil)
	p.waitTickAbove(vm3, tick2)
	vm4 := p.restore("vm4", snap2, mem1, &vmm.Identity{UID: 64004, GID: 64004})
	p.waitTickAbove(vm4, tick2)
	p.waitTickAbove(vm3, p.lastTick(vm3)) // vm3 went on while vm4 started
	vm3.Stop(ctx)
	vm4.Stop(ctx)
	p.checkDeviceHolds(mem1.BlockDevice, stack)
}

// probeRun holds what the steps of TestQEMUOnKernelDevices share.
type probeRun struct {
	t    *testing.T
	ctx  context.Context
	c    *client.Client
	d    *qemu.Driver
	disk string // the disk image's config
	dir  string
	// flat maps a memory device to the file its stack was flattened into
	// when envProbeMemory is "file".
	flat map[string]string
}

// mapped returns what the guests restored on the memory device dev map:
// dev itself, or its stack flattened into a file (envProbeMemory).
func (p *probeRun) mapped(dev rpc.Device) string {
	if f, ok := p.flat[dev.BlockDevice]; ok {
		return f
	}
	return dev.BlockDevice
}

// probeDisk writes a 4 MiB image of random bytes as one sealed layer and
// returns its config and contents.
func probeDisk(ctx context.Context, t *testing.T, dir string) (string, []byte) {
	t.Helper()
	want := make([]byte, 4<<20)
	r := rand.NewChaCha8([32]byte{7})
	r.Read(want)
	raw := filepath.Join(dir, "disk.raw")
	if err := os.WriteFile(raw, want, 0o600); err != nil {
		t.Fatal(err)
	}
	layer := filepath.Join(dir, "disk.lsmt")
	if _, err := image.ImportRaw(ctx, raw, layer, image.CommitOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "disk.json")
	if err := (&image.Config{Lowers: []image.LayerRef{{File: layer}}}).Save(cfg); err != nil {
		t.Fatal(err)
	}
	return cfg, want
}

// device creates a writable ublk device of the disk image.
func (p *probeRun) device() rpc.Device {
	p.t.Helper()
	dev, err := p.c.Create(p.ctx, rpc.CreateParams{Image: p.disk, Owner: "probe", Block: rpc.BlockUblk})
	if err != nil {
		p.t.Fatal(err)
	}
	if dev.Block != rpc.BlockUblk || dev.BlockDevice == "" {
		p.t.Fatalf("device %+v: want a ublk block device", dev)
	}
	return dev
}

// shared acquires the shared read-only ublk device of a memory stack,
// writing the stack's config on first use (a config rewritten is a new
// image to the daemon).
func (p *probeRun) shared(layers []string, holder string) rpc.Device {
	p.t.Helper()
	cfg := filepath.Join(p.dir, fmt.Sprintf("mem-%d.json", len(layers)))
	if _, err := os.Stat(cfg); err != nil {
		ic := &image.Config{}
		for _, l := range layers {
			ic.Lowers = append(ic.Lowers, image.LayerRef{File: l})
		}
		if err := ic.Save(cfg); err != nil {
			p.t.Fatal(err)
		}
	}
	dev, err := p.c.Acquire(p.ctx, rpc.AcquireParams{Image: cfg, Holder: holder, Block: rpc.BlockUblk})
	if err != nil {
		p.t.Fatal(err)
	}
	if os.Getenv(envProbeMemory) == "file" && p.flat[dev.BlockDevice] == "" {
		flat := filepath.Join(p.dir, fmt.Sprintf("mem-%d.flat", len(layers)))
		if err := memsnap.Materialize(p.ctx, layers, flat); err != nil {
			p.t.Fatal(err)
		}
		if err := os.Chmod(flat, 0o644); err != nil { // vm4 runs as its own uid
			p.t.Fatal(err)
		}
		if p.flat == nil {
			p.flat = map[string]string{}
		}
		p.flat[dev.BlockDevice] = flat
		p.t.Logf("guests on %s map %s instead (%s=file)", dev.BlockDevice, flat, envProbeMemory)
	}
	return dev
}

// restore restores the probe from snap with its memory mapped from mem and
// a fresh ublk disk (QEMU locks an image it writes: one disk per VM), as
// the identity as when set.
func (p *probeRun) restore(id, snap string, mem rpc.Device, as *vmm.Identity) vmm.Machine {
	p.t.Helper()
	vm, err := p.d.Restore(p.ctx, vmm.RestoreConfig{ID: id, SnapshotDir: snap, MemoryFile: p.mapped(mem),
		Drives: []vmm.Drive{{ID: "rootfs", Path: p.device().BlockDevice}}, RunDir: filepath.Join(p.dir, "run-"+id), RunAs: as})
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { vm.Stop(context.Background()) })
	return vm
}

// snapshot pauses vm and writes its state without RAM into dir/name.
func (p *probeRun) snapshot(vm vmm.Machine, name string) string {
	p.t.Helper()
	if err := vm.Pause(p.ctx); err != nil {
		p.t.Fatal(err)
	}
	ds, ok := vm.(interface {
		SnapshotDevices(ctx context.Context, dir string) (*vmm.Snapshot, error)
	})
	if !ok {
		p.t.Fatal("the QEMU machine writes no state without RAM")
	}
	out := filepath.Join(p.dir, name)
	if _, err := ds.SnapshotDevices(p.ctx, out); err != nil {
		p.t.Fatal(err)
	}
	return out
}

// checkMarker reads the probe's marker over the device's NBD socket: the
// daemon holds it (not only the kernel's page cache).
func (p *probeRun) checkMarker(dev rpc.Device) {
	p.t.Helper()
	nc, err := nbd.Dial(p.ctx, "unix", dev.Socket, dev.Export)
	if err != nil {
		p.t.Fatal(err)
	}
	defer nc.Close()
	const marker = "diskprobe was here"
	got := make([]byte, len(marker))
	if _, err := nc.ReadAt(got, 1<<20); err != nil || string(got) != marker {
		p.t.Fatalf("the daemon holds %q at 1 MiB (%v), want the guest's marker", got, err)
	}
}

// checkDeviceHolds compares the device's bytes with the stack flattened.
func (p *probeRun) checkDeviceHolds(dev string, layers []string) {
	p.t.Helper()
	flat := filepath.Join(p.dir, "stack.flat")
	if err := memsnap.Materialize(p.ctx, layers, flat); err != nil {
		p.t.Fatal(err)
	}
	want, got := daemontest.SumFile(p.t, flat), daemontest.SumFile(p.t, dev)
	_ = os.Remove(flat) // the lane's files take its RAM
	if want != got {
		p.t.Fatalf("memory device %s: sha256 %x after two guests ran on it, the stack's is %x", dev, got, want)
	}
}

// checkGuestRAM compares the guest RAM of the stopped VM vm, as its VMM
// maps it from dev, with the flattened memory stack layers: what a capture
// over dev wrote plus what dev serves must be exactly the guest's memory.
func (p *probeRun) checkGuestRAM(vm vmm.Machine, dev string, layers []string) {
	p.t.Helper()
	flat := filepath.Join(p.dir, "ram.flat")
	if err := memsnap.Materialize(p.ctx, layers, flat); err != nil {
		p.t.Fatal(err)
	}
	want, err := os.ReadFile(flat)
	if err != nil {
		p.t.Fatal(err)
	}
	pid := vm.Info().PID
	regions, err := memsnap.FindRegions(pid, dev)
	if err != nil {
		p.t.Fatal(err)
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		p.t.Fatal(err)
	}
	defer mem.Close()
	page := make([]byte, 4096)
	for _, r := range regions {
		for off := uint64(0); off < r.Size(); off += uint64(len(page)) {
			if _, err := mem.ReadAt(page, int64(r.Start+off)); err != nil {
				p.t.Fatalf("read guest RAM at %#x: %v", r.Start+off, err)
			}
			at := r.FileOffset + off
			if !bytes.Equal(page, want[at:at+uint64(len(page))]) {
				p.t.Fatalf("guest RAM page at offset %#x differs from the stack %v (the capture or the device lost it)", at, layers)
			}
		}
	}
	_ = os.Remove(flat)
}

var tickRE = regexp.MustCompile(`DISKPROBE tick (\d+)`)

// lastTick returns the last counter the guest printed.
func (p *probeRun) lastTick(vm vmm.Machine) int {
	p.t.Helper()
	b, _ := os.ReadFile(vm.Info().ConsoleLog)
	m := tickRE.FindAllSubmatch(b, -1)
	if len(m) == 0 {
		p.t.Fatalf("%s printed no counter:\n%s", filepath.Base(filepath.Dir(vm.Info().ConsoleLog)), b)
	}
	n, _ := strconv.Atoi(string(m[len(m)-1][1]))
	return n
}

// waitTickAbove waits for the guest to print a counter above n.
func (p *probeRun) waitTickAbove(vm vmm.Machine, n int) {
	p.t.Helper()
	p.waitFor(vm, fmt.Sprintf("a counter above %d", n), func(b []byte) (string, bool) {
		for _, m := range tickRE.FindAllSubmatch(b, -1) {
			if k, _ := strconv.Atoi(string(m[1])); k > n {
				return string(m[1]), true
			}
		}
		return "", false
	})
}

// waitLine waits for a console line matching re and returns its first group.
func (p *probeRun) waitLine(vm vmm.Machine, re string) string {
	p.t.Helper()
	rx := regexp.MustCompile(re)
	return p.waitFor(vm, re, func(b []byte) (string, bool) {
		if bytes.Contains(b, []byte("DISKPROBE error")) {
			return "", true
		}
		m := rx.FindSubmatch(b)
		if m == nil {
			return "", false
		}
		return string(m[1]), true
	})
}

func (p *probeRun) waitFor(vm vmm.Machine, what string, match func([]byte) (string, bool)) string {
	p.t.Helper()
	start := time.Now()
	for {
		b, _ := os.ReadFile(vm.Info().ConsoleLog)
		if got, ok := match(b); ok {
			p.t.Logf("%s: %s after %v", filepath.Base(filepath.Dir(vm.Info().ConsoleLog)), what, time.Since(start).Round(time.Millisecond))
			return got
		}
		if bytes.Contains(b, []byte("Kernel panic")) || bytes.Contains(b, []byte("AENV-LANE-EXIT")) {
			// The guest panicked or its init ended (the probe crashed): it
			// reboots, which ends its VMM; waiting on would only reach the deadline.
			mi, _ := os.ReadFile("/proc/meminfo")
			p.t.Fatalf("%s: the guest ended while the test waited for %s:\n%s\nthe lane's memory:\n%s", filepath.Base(filepath.Dir(vm.Info().ConsoleLog)), what, b, mi)
		}
		select {
		case <-p.ctx.Done():
			p.t.Fatalf("%s: no %s on the console:\n%s", filepath.Base(filepath.Dir(vm.Info().ConsoleLog)), what, b)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
