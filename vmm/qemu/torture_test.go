package qemu_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/testenv"
	"github.com/agentenv/agentenv/internal/testutil/guestassets"
	"github.com/agentenv/agentenv/internal/testutil/panicscan"
	"github.com/agentenv/agentenv/storage/lsmt"
	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/vmm/memsnap"
	"github.com/agentenv/agentenv/vmm/qemu"
	"github.com/agentenv/agentenv/vmm/vmmtest"
)

// Knobs of TestRestoreTorture (make soak sets them for the long run).
const (
	// envTortureRestores is the number of restores per variant.
	envTortureRestores = "AENV_TORTURE_RESTORES"
	// envTortureVariants names the variants to run, comma-separated, or
	// "all"; default tortureDefaultVariants.
	envTortureVariants = "AENV_TORTURE_VARIANTS"
)

// The CI size: one variant (the one a node runs: a private mapping of a
// snapshot of a booted guest), a few restores, well under two minutes
// under TCG on two cores.
const (
	tortureDefaultRestores = 10
	tortureDefaultVariants = "base"
)

// variant is one combination of the variables a guest panic after a
// restore could depend on. The zero value is what a node runs.
type variant struct {
	name    string
	cpu     string // -cpu model; "" is ours (max under TCG, host under KVM)
	tcg     string // extra -accel tcg properties (thread=, tb-size=)
	cmdline string // extra kernel parameters (the clock source)
	vcpus   int    // 0: one, as the default template
	shared  bool   // restores map their memory file shared (share=on), each a copy
	chained bool   // restore a snapshot taken of a restored guest, not of the booted one
	// cycle makes each restore's snapshot the next one's source, as a
	// sandbox paused and resumed over and over (the chain grows by one
	// each restore), instead of restoring one snapshot every time.
	cycle bool
	// layers (with cycle) pauses as a node does with memory layers: the
	// pages the guest wrote captured as a diff over the booted guest's
	// memory image, which the next restore maps and has the diff written
	// into before the guest runs (memsnap.WriteLayers), instead of a full
	// image of the guest's RAM.
	layers bool
}

// bootKey identifies the booted guest (and its snapshot) a variant
// restores: variants differing only in the mapping or the chain share it.
func (v variant) bootKey() string {
	return fmt.Sprintf("cpu=%s tcg=%s cmdline=%s vcpus=%d", v.cpu, v.tcg, v.cmdline, v.vcpus)
}

// tortureVariants: each changes one variable of base.
var tortureVariants = []variant{
	{name: "base"},
	{name: "shared", shared: true},
	{name: "chained", chained: true},
	{name: "chained-shared", chained: true, shared: true},
	{name: "cycles", cycle: true},
	{name: "cycles-shared", cycle: true, shared: true},
	{name: "cycles-layers", cycle: true, layers: true},
	{name: "cpu-qemu64", cpu: "qemu64"},
	{name: "tcg-single", tcg: "thread=single"},
	{name: "tb-32M", tcg: "tb-size=32"},
	{name: "tb-1G", tcg: "tb-size=1024"},
	{name: "clock-tsc-reliable", cmdline: "tsc=reliable"},
	{name: "clock-jiffies", cmdline: "clocksource=jiffies"},
	{name: "vcpus-2", vcpus: 2},
}

// TestRestoreTorture restores one snapshot of a guest many times per
// variant; each restored guest checks memory written before the snapshot,
// runs a slab-heavy workload (sockets, small files, processes) over a
// buffer it checksums before and after, and its console and kernel log are
// scanned for panics and oopses. It prints restores and panics per variant
// (so rates can be compared) and fails on any panic or wrong byte.
func TestRestoreTorture(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the guests' network namespaces and taps")
	}
	n, variants := tortureConfig(t)
	a := guestassets.Get(t)
	d, err := qemu.New(context.Background(), qemu.Options{ProbeKernel: a.Kernel})
	if err != nil {
		testenv.Missing(t, "qemu: %v", err)
	}
	accel, why := d.Accel()
	t.Logf("accelerator %s (%s); %d restores per variant", accel, why, n)
	tr := &torture{t: t, d: d, a: assetsOf(a.Kernel, a.Initrd, a.Rootfs), work: t.TempDir(), boots: map[string]*bootSnap{}}
	var rows []*tortureRow
	for _, v := range variants {
		row := tr.run(v, n)
		rows = append(rows, row)
		t.Logf("%s: %d restores, %d panics, %d failures", v.name, row.restores, row.panics, row.failures)
	}
	t.Log("\n" + tortureTable(rows))
	for _, r := range rows {
		if r.panics > 0 || r.failures > 0 {
			t.Errorf("variant %s: %d guest panics and %d failed checks in %d restores; first: %s", r.v.name, r.panics, r.failures, r.restores, r.first)
		}
	}
}

// tortureConfig reads the restores per variant and the variants.
func tortureConfig(t *testing.T) (int, []variant) {
	n := tortureDefaultRestores
	if s := os.Getenv(envTortureRestores); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("%s=%q: want a positive number", envTortureRestores, s)
		}
		n = v
	}
	names := os.Getenv(envTortureVariants)
	if names == "" {
		names = tortureDefaultVariants
	}
	if names == "all" {
		return n, tortureVariants
	}
	var out []variant
	for _, name := range strings.Split(names, ",") {
		found := false
		for _, v := range tortureVariants {
			if v.name == strings.TrimSpace(name) {
				out, found = append(out, v), true
			}
		}
		if !found {
			t.Fatalf("%s: no variant %q", envTortureVariants, name)
		}
	}
	return n, out
}

type guestAssets struct{ kernel, initrd, rootfs string }

func assetsOf(k, i, r string) guestAssets { return guestAssets{k, i, r} }

// torture holds what the variants share: the driver and the snapshots of
// booted guests (one per boot key).
type torture struct {
	t     *testing.T
	d     *qemu.Driver
	a     guestAssets
	work  string
	boots map[string]*bootSnap
	seq   int
}

// bootSnap is a snapshot of a booted guest and what it holds.
type bootSnap struct {
	dir, memory string // snapshot directory and its memory image
	seed        string // sha256 of /dev/shm/seed in the guest
	clock       string // the guest's clock source
	chain       *chainSnap
	// net is the network the guest booted on, which every restore of it
	// reuses: in another namespace the host end of the tap has another
	// MAC, and a restored guest would wait seconds for its stale neighbor
	// entry to expire before it answers.
	net  *vmmtest.TestNet
	base *lsmt.UUID // see baseUUID
}

// chainSnap is a snapshot to restore: its directory, the memory image
// mapped and the memory layers written over it.
type chainSnap struct {
	dir, memory string
	layers      []string
}

// tortureRow is one variant's result.
type tortureRow struct {
	v                          variant
	clock                      string
	restores, panics, failures int
	ready, work                time.Duration // total restore-to-agent and workload times
	first                      string        // the first panic's or failure's lines
}

func (tr *torture) run(v variant, n int) *tortureRow {
	t := tr.t
	qemu.Tune(tr.d, v.cpu, v.tcg, v.shared)
	row := &tortureRow{v: v}
	bs := tr.boot(v)
	row.clock = bs.clock
	snap := &chainSnap{dir: bs.dir, memory: bs.memory}
	if v.chained {
		snap = tr.chain(v, bs)
	}
	for i := 0; i < n; i++ {
		res := tr.restoreOnce(v, bs, snap, i)
		if res.next != nil {
			if snap.dir != bs.dir {
				_ = os.RemoveAll(snap.dir) // the previous cycle's snapshot
			}
			snap = res.next
		}
		row.restores++
		row.ready += res.ready
		row.work += res.work
		switch {
		case res.panic != "":
			row.panics++
			t.Logf("%s restore %d: guest panic:\n%s", v.name, i, res.panic)
			if row.first == "" {
				row.first = res.panic
			}
		case res.failure != "":
			row.failures++
			t.Logf("%s restore %d: %s", v.name, i, res.failure)
			if row.first == "" {
				row.first = res.failure
			}
		}
	}
	return row
}

// runDir is a fresh run directory for the next machine.
func (tr *torture) runDir(name string) string {
	tr.seq++
	return filepath.Join(tr.work, fmt.Sprintf("%s-%d", name, tr.seq))
}

// boot returns the snapshot of a booted guest for v's boot key, booting it
// on first use: the guest writes a seed into its RAM and keeps a loop
// running, so the snapshot catches it busy.
func (tr *torture) boot(v variant) *bootSnap {
	t := tr.t
	if bs := tr.boots[v.bootKey()]; bs != nil {
		return bs
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tn := vmmtest.NewTestNet(t)
	cmdline := strings.TrimSpace("root=/dev/vda ro loglevel=5 " + vmmtest.IPCmdline + " " + v.cmdline)
	rd := tr.runDir("boot")
	vm, err := tr.d.Boot(ctx, vmm.Config{ID: "torture-boot", Kernel: tr.a.kernel, Initrd: tr.a.initrd, Cmdline: cmdline,
		VCPUs: max(v.vcpus, 1), MemoryMiB: 256, RunDir: rd,
		Drives: []vmm.Drive{{ID: "rootfs", Path: tr.a.rootfs, ReadOnly: true}}, NICs: []vmm.NIC{tn.NIC()}})
	if err != nil {
		t.Fatalf("boot for %s: %v", v.bootKey(), err)
	}
	defer vm.Stop(context.Background())
	if err := tn.WaitHealthy(ctx); err != nil {
		console, _ := os.ReadFile(vm.Info().ConsoleLog)
		t.Fatalf("boot for %s: %v\n%s", v.bootKey(), err, tailOf(console, 3000))
	}
	out, err := guestRun(ctx, tn, "/bin/sh", "-c", seedScript)
	if err != nil {
		t.Fatalf("boot for %s: write the seed: %v", v.bootKey(), err)
	}
	f := strings.Fields(out)
	if len(f) != 2 || len(f[0]) != 64 {
		t.Fatalf("boot for %s: seed script printed %q, want a sha256 and the clock source", v.bootKey(), out)
	}
	if p := panicscan.Scan(readConsole(vm)); p != "" {
		t.Fatalf("boot for %s: the booted guest already reports:\n%s", v.bootKey(), p)
	}
	if err := vm.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(tr.work, fmt.Sprintf("snap-%d", len(tr.boots)))
	snap, err := vm.Snapshot(ctx, dir)
	if err != nil {
		t.Fatalf("snapshot for %s: %v", v.bootKey(), err)
	}
	bs := &bootSnap{dir: dir, memory: snap.MemoryFile, seed: f[0], clock: f[1], net: tn}
	if bs.memory == "" {
		bs.memory = filepath.Join(dir, vmm.SnapshotMemoryFile)
	}
	tr.boots[v.bootKey()] = bs
	t.Logf("booted and snapshotted %s (clock source %s)", v.bootKey(), bs.clock)
	return bs
}

// chain returns a snapshot of a guest restored from bs and run once (the
// workload).
func (tr *torture) chain(v variant, bs *bootSnap) *chainSnap {
	t := tr.t
	if bs.chain != nil {
		return bs.chain
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	tn := bs.net
	mem := tr.memoryFor(v, bs.memory)
	vm, err := tr.d.Restore(ctx, vmm.RestoreConfig{ID: "torture-chain", SnapshotDir: bs.dir, MemoryFile: mem,
		RunDir: tr.runDir("chain"), NICs: []vmm.NIC{tn.NIC()}})
	if err != nil {
		t.Fatalf("restore for the chained snapshot: %v", err)
	}
	defer vm.Stop(context.Background())
	if err := tn.WaitHealthy(ctx); err != nil {
		t.Fatalf("restore for the chained snapshot: %v\n%s", err, tailOf(readConsole(vm), 3000))
	}
	if w := runWorkload(ctx, tn, bs.seed); w.failure != "" {
		t.Fatalf("restore for the chained snapshot: %s\n%s", w.failure, tailOf(readConsole(vm), 3000))
	}
	ch := tr.pauseSnapshot(ctx, v, bs, vm)
	if mem != bs.memory {
		_ = os.Remove(mem)
	}
	bs.chain = ch
	return ch
}

// pauseSnapshot pauses the restored vm and snapshots it the way a node
// pauses a sandbox: the device state alone and the guest RAM captured
// beside it.
func (tr *torture) pauseSnapshot(ctx context.Context, v variant, bs *bootSnap, vm vmm.Machine) *chainSnap {
	t := tr.t
	if err := vm.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	tr.seq++
	dir := filepath.Join(tr.work, fmt.Sprintf("chain-%d", tr.seq))
	ds, ok := vm.(vmm.DeviceSnapshotter)
	if !ok {
		t.Fatal("the QEMU machine writes no device snapshot")
	}
	if _, err := ds.SnapshotDevices(ctx, dir); err != nil {
		t.Fatal(err)
	}
	if v.layers {
		diff := filepath.Join(dir, "memory.lsmt")
		if _, err := memsnap.CaptureDiff(ctx, vm.Info().PID, bs.memory, diff, tr.baseUUID(ctx, bs), "torture pause"); err != nil {
			t.Fatal(err)
		}
		return &chainSnap{dir: dir, memory: bs.memory, layers: []string{diff}}
	}
	ch := &chainSnap{dir: dir, memory: filepath.Join(dir, "memory.img")}
	if _, err := vmmtest.CaptureMemory(vm.Info().PID, vm.Info().MemoryFile, ch.memory); err != nil {
		t.Fatal(err)
	}
	return ch
}

// baseUUID is the UUID of the booted guest's memory imported as a base
// layer, the parent of the diffs of a layers variant (a diff against the
// mapped image is a superset of the last, so one diff over it suffices).
func (tr *torture) baseUUID(ctx context.Context, bs *bootSnap) lsmt.UUID {
	if bs.base != nil {
		return *bs.base
	}
	path := bs.memory + ".lsmt"
	if _, err := memsnap.ImportFull(ctx, bs.memory, path, "torture base"); err != nil {
		tr.t.Fatal(err)
	}
	u, err := memsnap.LayerUUID(path)
	if err != nil {
		tr.t.Fatal(err)
	}
	bs.base = &u
	return u
}

// memoryFor is the memory file a restore of v maps: the snapshot's image
// itself when private, a copy of it when shared (the guest writes it).
func (tr *torture) memoryFor(v variant, image string) string {
	if !v.shared {
		return image
	}
	cp := filepath.Join(tr.work, fmt.Sprintf("memory-copy-%d", tr.seq))
	if _, err := qemu.SparseCopy(image, cp); err != nil {
		tr.t.Fatal(err)
	}
	return cp
}

func readConsole(vm vmm.Machine) []byte {
	b, _ := os.ReadFile(vm.Info().ConsoleLog)
	return b
}

func tailOf(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
