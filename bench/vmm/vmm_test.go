// Package vmm_test benchmarks the VM lifecycle on this machine with the QEMU
// driver: cold boot to agent-ready, snapshot, restore to agent-ready, and
// the restore/cold-boot ratio (goal <= 0.2), as medians over several runs.
//
//	go test -run '^$' -bench . -benchtime 1x ./bench/vmm/
package vmm_test

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/testutil/guestassets"
	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/vmm/qemu"
	"github.com/agentenv/agentenv/vmm/vmmtest"
)

func runs() int {
	if n, err := strconv.Atoi(os.Getenv("AENV_BENCH_RUNS")); err == nil && n > 0 {
		return n
	}
	return 5
}

func BenchmarkQEMULifecycle(b *testing.B) {
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
	var boot, snap, restore, restoreCall []time.Duration
	var stateBytes []int64
	for i := range runs() {
		tn := vmmtest.NewTestNet(b)
		cfg := vmm.Config{
			ID: fmt.Sprintf("bench%d", i), Kernel: a.Kernel, Initrd: a.Initrd,
			Cmdline: "root=/dev/vda ro quiet " + vmmtest.IPCmdline, MemoryMiB: 256,
			RunDir: filepath.Join(work, fmt.Sprintf("boot%d", i)),
			Drives: []vmm.Drive{{ID: "rootfs", Path: a.Rootfs, ReadOnly: true}},
			NICs:   []vmm.NIC{tn.NIC()},
		}
		t0 := time.Now()
		vm, err := d.Boot(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		mustReady(b, tn)
		boot = append(boot, time.Since(t0))

		dir := filepath.Join(work, fmt.Sprintf("snap%d", i))
		t0 = time.Now()
		if err := vm.Pause(ctx); err != nil {
			b.Fatal(err)
		}
		s, err := vm.Snapshot(ctx, dir)
		if err != nil {
			b.Fatal(err)
		}
		snap = append(snap, time.Since(t0))
		stateBytes = append(stateBytes, s.StateBytes)
		_ = vm.Stop(ctx)

		tn2 := vmmtest.NewTestNet(b)
		t0 = time.Now()
		rvm, err := d.Restore(ctx, vmm.RestoreConfig{ID: fmt.Sprintf("r%d", i), SnapshotDir: dir,
			RunDir: filepath.Join(work, fmt.Sprintf("restore%d", i)), NICs: []vmm.NIC{tn2.NIC()}})
		if err != nil {
			b.Fatal(err)
		}
		restoreCall = append(restoreCall, time.Since(t0))
		mustReady(b, tn2)
		restore = append(restore, time.Since(t0))
		_ = rvm.Stop(ctx)
	}
	mb, ms, mr := median(boot), median(snap), median(restore)
	ratio := float64(mr) / float64(mb)
	fmt.Printf("qemu (%s), %d runs, medians:\n", accel, len(boot))
	fmt.Printf("  cold boot to agent-ready   %v\n", mb.Round(time.Millisecond))
	fmt.Printf("  pause + snapshot           %v\n", ms.Round(time.Millisecond))
	fmt.Printf("  saved state size           %d KiB (memory image separate, 256 MiB logical)\n", median(stateBytes)>>10)
	fmt.Printf("  restore (QEMU up, state loaded, vCPUs running) %v\n", median(restoreCall).Round(time.Millisecond))
	fmt.Printf("  restore to agent-ready     %v\n", mr.Round(time.Millisecond))
	fmt.Printf("  restore / cold boot        %.3f (goal <= 0.2)\n", ratio)
	b.ReportMetric(float64(mb.Milliseconds()), "boot-ms")
	b.ReportMetric(float64(mr.Milliseconds()), "restore-ms")
	b.ReportMetric(ratio, "restore/boot")
}

func mustReady(b *testing.B, tn *vmmtest.TestNet) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := tn.WaitHealthy(ctx); err != nil {
		b.Fatal(err)
	}
}

func median[T cmp.Ordered](v []T) T {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
