package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/guest/agent/agentclient"
	"github.com/agentenv/agentenv/internal/testutil/guestassets"
	"github.com/agentenv/agentenv/storage/lsmt"
	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/vmm/memsnap"
	"github.com/agentenv/agentenv/vmm/vmmtest"
)

// maxTestDeviceState bounds a device-only state file of a 256 MiB guest:
// the device state is tens of KiB; guest RAM would be over a hundred MiB,
// and even the firmware's RAM blocks a migration carries over one.
const maxTestDeviceState = 1 << 20

// TestDeviceSnapshot: a VM restored from a shared memory image (so its RAM
// is a private mapping that a plain snapshot would stream whole) takes a
// device-only snapshot; its RAM, captured separately, restores with it; a
// second round starts from that restored VM. Along the way: a cancelled
// device snapshot leaves the VM going, a restore writes nothing into guest
// RAM, and the size against a full snapshot of the same VM.
func TestDeviceSnapshot(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces and taps")
	}
	a := guestassets.Get(t)
	ctx := context.Background()
	d, err := New(ctx, Options{ProbeKernel: a.Kernel})
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()

	// A template: cold boot (RAM shared with its file), snapshot, stop.
	tn := vmmtest.NewTestNet(t)
	boot, err := d.Boot(ctx, vmm.Config{
		ID: "devsnap-boot", Kernel: a.Kernel, Initrd: a.Initrd, MemoryMiB: 256, RunDir: filepath.Join(work, "boot"),
		Cmdline: "root=/dev/vda ro quiet " + vmmtest.IPCmdline,
		Drives:  []vmm.Drive{{ID: "rootfs", Path: a.Rootfs, ReadOnly: true}},
		NICs:    []vmm.NIC{tn.NIC()},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = boot.Stop(context.Background()) })
	waitHealthy(t, boot, tn)
	guest(t, tn, "echo m0 > /dev/shm/m0")
	// Written aside and renamed, so a read never sees a truncated file.
	guest(t, tn, `nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /dev/shm/c.tmp; mv /dev/shm/c.tmp /dev/shm/counter; sleep 0.05; done' >/dev/null 2>&1 &`)
	waitCounter(t, tn, 3)
	if err := boot.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(work, "base")
	if _, err := boot.Snapshot(ctx, base); err != nil {
		t.Fatal(err)
	}
	_ = boot.Stop(ctx)

	// The first sandbox: restored privately from the template's memory.
	tn = vmmtest.NewTestNet(t)
	vm, err := d.Restore(ctx, vmm.RestoreConfig{ID: "devsnap-r0", SnapshotDir: base, RunDir: filepath.Join(work, "r0"), NICs: []vmm.NIC{tn.NIC()}, Paused: true})
	if err != nil {
		t.Fatal(err)
	}
	if kib := privateKiB(t, vm.Info().PID, vm.Info().MemoryFile); kib != 0 {
		t.Fatalf("%d KiB of guest RAM written before the restored guest ran", kib)
	}
	if err := vm.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = vm.Stop(context.Background()) })
	waitHealthy(t, vm, tn)

	for round := 1; round <= 2; round++ {
		vm, tn = deviceSnapshotRound(t, d, vm, tn, work, round)
	}
}

// deviceSnapshotRound writes a marker into vm, snapshots it without RAM,
// captures its RAM, stops it and restores a successor from both.
func deviceSnapshotRound(t *testing.T, d *Driver, vm vmm.Machine, tn *vmmtest.TestNet, work string, round int) (vmm.Machine, *vmmtest.TestNet) {
	ctx := context.Background()
	marker := fmt.Sprintf("m%d", round)
	guest(t, tn, fmt.Sprintf("echo %s > /dev/shm/%s", marker, marker))
	before := counter(t, tn)
	ds := vm.(vmm.DeviceSnapshotter)
	dir := filepath.Join(work, fmt.Sprintf("dev%d", round))
	if _, err := ds.SnapshotDevices(ctx, dir); !errors.Is(err, vmm.ErrNotPaused) {
		t.Fatalf("device snapshot of a running VM: got %v, want ErrNotPaused", err)
	}
	if err := vm.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if round == 2 {
		cancelledKeepsVM(t, vm.(*machine), filepath.Join(work, "cancelled"))
	}
	snap, err := ds.SnapshotDevices(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("round %d: device snapshot state %d bytes (RAM %d MiB), took %s", round, snap.StateBytes, snap.MemBytes>>20, snap.Took)
	if snap.StateBytes <= 0 || snap.StateBytes >= maxTestDeviceState || snap.MemBytes < 256<<20 {
		t.Fatalf("device snapshot: state %d bytes (want 0 < state < %d), memory %d bytes", snap.StateBytes, maxTestDeviceState, snap.MemBytes)
	}
	if fi, err := os.Stat(snap.StateFile); err != nil || fi.Size() != snap.StateBytes {
		t.Fatalf("state file %v: size disagrees with %d", err, snap.StateBytes)
	}
	if snap.MemoryFile != "" {
		t.Fatalf("device snapshot names a memory file: %s", snap.MemoryFile)
	}
	if _, err := os.Stat(filepath.Join(dir, vmm.SnapshotMemoryFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("device snapshot dir holds a memory image: %v", err)
	}
	checkDeviceState(t, dir)
	// Round 1 captures the whole of guest RAM into a file; round 2 only
	// what the VM wrote over the file it maps, as a layer the restore
	// writes over that file (RestoreConfig.MemoryLayers).
	memFile := filepath.Join(work, fmt.Sprintf("mem%d", round))
	var layers []string
	if round == 1 {
		written, err := vmmtest.CaptureMemory(vm.Info().PID, vm.Info().MemoryFile, memFile)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: captured %d MiB of non-zero guest RAM", round, written>>20)
	} else {
		memFile = vm.Info().MemoryFile
		layers = []string{filepath.Join(work, "diff.lsmt")}
		st, err := memsnap.CaptureDiff(ctx, vm.Info().PID, memFile, layers[0], lsmt.UUID{}, "test")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: captured %d written pages over %s", round, st.Pages+st.ZeroPages, memFile)
	}
	if round == 2 {
		// A device snapshot leaves the VM paused, so another in the same
		// pause is the same state again.
		again, err := ds.SnapshotDevices(ctx, filepath.Join(work, "again"))
		if err != nil || again.StateBytes != snap.StateBytes {
			t.Fatalf("second device snapshot in one pause: %v (%d bytes, the first %d)", err, again.StateBytes, snap.StateBytes)
		}
		// The same VM's full snapshot streams its RAM into the state.
		full, err := vm.Snapshot(ctx, filepath.Join(work, "full"))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("full snapshot of the same restored VM: state %d bytes, took %s", full.StateBytes, full.Took)
		if full.StateBytes < 10*snap.StateBytes {
			t.Errorf("full state %d bytes is not much larger than device state %d: is RAM really left out?", full.StateBytes, snap.StateBytes)
		}
		// A migration leaves QEMU postmigrate, from which only running
		// leads out, which a device snapshot must not do (memory is
		// captured already).
		if _, err := ds.SnapshotDevices(ctx, filepath.Join(work, "after-full")); !errors.Is(err, vmm.ErrUnsupported) || !strings.Contains(err.Error(), "during this pause") {
			t.Fatalf("device snapshot after a full one in the same pause: got %v, want ErrUnsupported", err)
		}
	}
	if err := vm.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	if _, err := d.Restore(ctx, vmm.RestoreConfig{ID: "nomem", SnapshotDir: dir, RunDir: filepath.Join(work, "nomem"), NICs: []vmm.NIC{tn.NIC()}}); err == nil || !strings.Contains(err.Error(), "MemoryFile") {
		t.Fatalf("restore of a device snapshot without a memory file: %v", err)
	}
	ntn := vmmtest.NewTestNet(t)
	next, err := d.Restore(ctx, vmm.RestoreConfig{ID: fmt.Sprintf("devsnap-r%d", round), SnapshotDir: dir, MemoryFile: memFile,
		MemoryLayers: layers, RunDir: filepath.Join(work, fmt.Sprintf("r%d", round)), NICs: []vmm.NIC{ntn.NIC()}, Paused: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = next.Stop(context.Background()) })
	// Nothing but the guest may write its RAM: a restore that did (say,
	// firmware loaded at reset) would corrupt the guest underneath it.
	if kib := privateKiB(t, next.Info().PID, memFile); layers == nil && kib != 0 {
		t.Fatalf("round %d: %d KiB of guest RAM written before the guest ran", round, kib)
	}
	if err := next.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	waitHealthy(t, next, ntn)
	var want []string
	for i := 0; i <= round; i++ {
		want = append(want, fmt.Sprintf("m%d", i))
	}
	if got := guest(t, ntn, "cat /dev/shm/m* | tr '\\n' ' '"); strings.TrimSpace(got) != strings.Join(want, " ") {
		t.Fatalf("round %d: markers after restore = %q, want %q", round, got, want)
	}
	after := counter(t, ntn)
	if after < before {
		t.Fatalf("round %d: counter %d after restore is behind %d before the snapshot", round, after, before)
	}
	waitCounter(t, ntn, after+3)
	return next, ntn
}

// checkDeviceState: the snapshot's state is a QEMU state file, small, and
// its config says it holds no memory.
func checkDeviceState(t *testing.T, dir string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, vmm.SnapshotStateFile))
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 8 || string(b[:4]) != "QEVM" || len(b) > maxTestDeviceState {
		t.Fatalf("device state: %d bytes starting %q, want a QEMU state file under %d bytes", len(b), b[:min(len(b), 4)], maxTestDeviceState)
	}
	spec, err := readSpec(dir)
	if err != nil || !spec.NoMemory || spec.Version != specVersion {
		t.Fatalf("device snapshot config %+v (%v): want noMemory, version %d", spec, err, specVersion)
	}
}

// privateKiB is how much of the mapping of path in process pid was written
// (copied on write into anonymous memory).
func privateKiB(t *testing.T, pid int, path string) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		t.Fatal(err)
	}
	in, found, total := false, false, 0
	for _, line := range strings.Split(string(b), "\n") {
		fields := strings.Fields(line)
		switch {
		case len(fields) >= 5 && strings.Contains(fields[0], "-") && len(fields[1]) == 4:
			// A mapping's header line; anonymous ones name no file.
			in = len(fields) >= 6 && fields[len(fields)-1] == path
			found = found || in
		case in && len(fields) == 3 && fields[0] == "Anonymous:":
			n, _ := strconv.Atoi(fields[1])
			total += n
		}
	}
	if !found {
		t.Fatalf("process %d does not map %s", pid, path)
	}
	return total
}

// cancelledKeepsVM: a device snapshot whose context ends mid-stream returns
// the context's error, leaves no state file and a VM that goes on.
func cancelledKeepsVM(t *testing.T, m *machine, dir string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	_, err := m.SnapshotDevices(ctx, dir)
	switch {
	case err == nil:
		t.Log("the device snapshot finished within its deadline; nothing to cancel")
	case !errors.Is(err, context.DeadlineExceeded):
		t.Fatalf("device snapshot past its deadline: got %v, want DeadlineExceeded", err)
	}
	if _, serr := os.Stat(filepath.Join(dir, vmm.SnapshotStateFile)); err != nil && !errors.Is(serr, os.ErrNotExist) {
		t.Fatalf("a cancelled device snapshot left a state file: %v", serr)
	}
	if _, serr := os.Stat(filepath.Join(dir, vmm.SnapshotStateFile+".tmp")); !errors.Is(serr, os.ErrNotExist) {
		t.Fatalf("a device snapshot left its temporary file: %v", serr)
	}
	bg := context.Background()
	if err := m.Resume(bg); err != nil {
		t.Fatalf("resume after a cancelled device snapshot: %v", err)
	}
	if err := m.Pause(bg); err != nil {
		t.Fatal(err)
	}
}

func waitHealthy(t *testing.T, vm vmm.Machine, tn *vmmtest.TestNet) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := tn.WaitHealthy(ctx); err != nil {
		console, _ := os.ReadFile(vm.Info().ConsoleLog)
		if len(console) > 3000 {
			console = console[len(console)-3000:]
		}
		t.Fatalf("%v\nconsole:\n%s", err, console)
	}
}

func guest(t *testing.T, tn *vmmtest.TestNet, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, errOut, code, err := agentclient.Run(ctx, tn.AgentURL(), tn.HTTP, "/bin/sh", "-c", script)
	if err != nil || code != 0 {
		t.Fatalf("guest %q: exit %d, %v: %s", script, code, err, errOut)
	}
	return strings.TrimSpace(string(out))
}

func counter(t *testing.T, tn *vmmtest.TestNet) int {
	t.Helper()
	n, err := strconv.Atoi(guest(t, tn, "cat /dev/shm/counter"))
	if err != nil {
		t.Fatalf("counter: %v", err)
	}
	return n
}

func waitCounter(t *testing.T, tn *vmmtest.TestNet, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if v, _ := strconv.Atoi(guest(t, tn, "cat /dev/shm/counter 2>/dev/null || echo 0")); v >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("guest counter stuck below %d", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
