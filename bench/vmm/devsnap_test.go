package vmm_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/testutil/guestassets"
	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/vmm/qemu"
	"github.com/agentenv/agentenv/vmm/vmmtest"
)

// BenchmarkQEMUDeviceSnapshot compares, for a VM restored from a shared
// memory image (so its RAM is a private mapping), a snapshot without RAM
// (vmm.DeviceSnapshotter; memory captured separately) with the reference, a
// full snapshot of the same VM: pause+snapshot time, state size, restore to
// agent-ready, and the restored VM's anonymous memory (RAM loaded from the
// state lands there; with a memory file it stays in the shared page cache).
//
//	go test -run '^$' -bench QEMUDeviceSnapshot -benchtime 1x ./bench/vmm/
func BenchmarkQEMUDeviceSnapshot(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root for network namespaces and taps")
	}
	a := guestassets.Get(b)
	ctx := context.Background()
	d, err := qemu.New(ctx, qemu.Options{ProbeKernel: a.Kernel})
	if err != nil {
		b.Fatal(err)
	}
	accel, _ := d.Accel()
	work := b.TempDir()

	// Template: boot, snapshot; the measured VM is restored from it.
	tn := vmmtest.NewTestNet(b)
	vm, err := d.Boot(ctx, vmm.Config{ID: "tmpl", Kernel: a.Kernel, Initrd: a.Initrd,
		Cmdline: "root=/dev/vda ro quiet " + vmmtest.IPCmdline, MemoryMiB: 256, RunDir: filepath.Join(work, "tmpl"),
		Drives: []vmm.Drive{{ID: "rootfs", Path: a.Rootfs, ReadOnly: true}}, NICs: []vmm.NIC{tn.NIC()}})
	if err != nil {
		b.Fatal(err)
	}
	mustReady(b, tn)
	must(b, vm.Pause(ctx))
	base := filepath.Join(work, "base")
	if _, err := vm.Snapshot(ctx, base); err != nil {
		b.Fatal(err)
	}
	_ = vm.Stop(ctx)
	tn = vmmtest.NewTestNet(b)
	src, err := d.Restore(ctx, vmm.RestoreConfig{ID: "src", SnapshotDir: base, RunDir: filepath.Join(work, "src"), NICs: []vmm.NIC{tn.NIC()}})
	if err != nil {
		b.Fatal(err)
	}
	defer src.Stop(ctx)
	mustReady(b, tn)

	var devT, fullT, devRestore, fullRestore []time.Duration
	var devBytes, fullBytes, devAnon, fullAnon int64
	for i := range runs() {
		dir := filepath.Join(work, fmt.Sprintf("dev%d", i))
		mem := filepath.Join(work, fmt.Sprintf("mem%d", i))
		t0 := time.Now()
		must(b, src.Pause(ctx))
		s, err := src.(vmm.DeviceSnapshotter).SnapshotDevices(ctx, dir)
		if err != nil {
			b.Fatal(err)
		}
		devT = append(devT, time.Since(t0))
		devBytes = s.StateBytes
		if _, err := vmmtest.CaptureMemory(src.Info().PID, src.Info().MemoryFile, mem); err != nil {
			b.Fatal(err)
		}
		must(b, src.Resume(ctx))

		full := filepath.Join(work, fmt.Sprintf("full%d", i))
		t0 = time.Now()
		must(b, src.Pause(ctx))
		fs, err := src.Snapshot(ctx, full)
		if err != nil {
			b.Fatal(err)
		}
		fullT = append(fullT, time.Since(t0))
		fullBytes = fs.StateBytes
		must(b, src.Resume(ctx))

		t, anon := restoreReady(b, d, vmm.RestoreConfig{SnapshotDir: dir, MemoryFile: mem}, filepath.Join(work, fmt.Sprintf("rd%d", i)))
		devRestore, devAnon = append(devRestore, t), anon
		t, anon = restoreReady(b, d, vmm.RestoreConfig{SnapshotDir: full}, filepath.Join(work, fmt.Sprintf("rf%d", i)))
		fullRestore, fullAnon = append(fullRestore, t), anon
		_ = os.RemoveAll(full)
	}
	md, mf := median(devT), median(fullT)
	rd, rf := median(devRestore), median(fullRestore)
	fmt.Printf("qemu (%s), restored 256 MiB VM, %d runs, medians (reference: full snapshot of the same VM):\n", accel, len(devT))
	fmt.Printf("  pause + snapshot     devices %v   full %v   ratio %.2f\n", md.Round(time.Millisecond), mf.Round(time.Millisecond), float64(md)/float64(mf))
	fmt.Printf("  state file           devices %d KiB   full %d KiB   ratio %.4f\n", devBytes>>10, fullBytes>>10, float64(devBytes)/float64(fullBytes))
	fmt.Printf("  restore to ready     devices+memory file %v   full %v   ratio %.2f\n", rd.Round(time.Millisecond), rf.Round(time.Millisecond), float64(rd)/float64(rf))
	fmt.Printf("  restored VM anon RSS devices+memory file %d MiB   full %d MiB\n", devAnon>>20, fullAnon>>20)
	b.ReportMetric(float64(md)/float64(mf), "devsnap/full-time")
	b.ReportMetric(float64(devBytes)/float64(fullBytes), "devsnap/full-bytes")
}

// restoreReady restores rc to agent-ready and returns the time and the
// VMM's anonymous resident memory, then stops it.
func restoreReady(b *testing.B, d *qemu.Driver, rc vmm.RestoreConfig, run string) (time.Duration, int64) {
	tn := vmmtest.NewTestNet(b)
	rc.ID, rc.RunDir, rc.NICs = filepath.Base(run), run, []vmm.NIC{tn.NIC()}
	t0 := time.Now()
	vm, err := d.Restore(context.Background(), rc)
	if err != nil {
		b.Fatal(err)
	}
	defer vm.Stop(context.Background())
	mustReady(b, tn)
	took := time.Since(t0)
	return took, rssAnon(vm.Info().PID)
}

func rssAnon(pid int) int64 {
	st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(st), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "RssAnon:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

func must(b *testing.B, err error) {
	b.Helper()
	if err != nil {
		b.Fatal(err)
	}
}
