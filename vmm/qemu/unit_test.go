package qemu

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/vmm"
)

func TestKernelCmdline(t *testing.T) {
	t.Parallel()
	tests := []struct {
		user, accel string
		want        []string
		notWant     []string
	}{
		{"root=/dev/vda", "tcg", []string{"console=ttyS0", "root=/dev/vda", "tsc_early_khz=2000000", "panic=-1"}, nil},
		{"console=hvc0 root=/dev/vda", "tcg", []string{"console=hvc0"}, []string{"console=ttyS0"}},
		{"root=/dev/vda", "kvm", []string{"root=/dev/vda"}, []string{"tsc_early_khz"}},
		{"tsc_early_khz=5", "tcg", []string{"tsc_early_khz=5"}, []string{"tsc_early_khz=2000000"}},
	}
	for _, tc := range tests {
		got := kernelCmdline(tc.user, tc.accel, 2000000)
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("kernelCmdline(%q, %s) = %q, missing %q", tc.user, tc.accel, got, w)
			}
		}
		for _, w := range tc.notWant {
			if strings.Contains(got, w) {
				t.Errorf("kernelCmdline(%q, %s) = %q, must not contain %q", tc.user, tc.accel, got, w)
			}
		}
	}
}

// TestInfoHostTSC: a machine reports the host's TSC, which the guest's
// agent corrects its clock's rate by, under TCG only; under KVM the
// guest's kvm-clock is left to the host.
func TestInfoHostTSC(t *testing.T) {
	t.Parallel()
	for accel, want := range map[string]int{"tcg": 2000000, "kvm": 0} {
		m := &machine{spec: &machineSpec{Accel: accel}, tscKHz: 2000000, rd: &runDir{}, proc: &os.Process{Pid: 1}}
		if got := m.Info().TSCkHz; got != want {
			t.Errorf("%s machine reports host TSC %d kHz, want %d", accel, got, want)
		}
	}
}

// testFDs are where a machine with one tap finds its handed files.
var testFDs = argFDs{QMP: 4, Console: 5, Memory: 6}

func TestBuildArgs(t *testing.T) {
	t.Parallel()
	spec := &machineSpec{Kernel: "/k", Cmdline: "c", VCPUs: 2, MemoryMiB: 512, Accel: "tcg",
		Drives: []vmm.Drive{
			{ID: "rootfs", Path: "/img,with,commas", ReadOnly: true},
			{ID: "data", NBD: &vmm.NBDSource{Socket: "/run/nbd.sock", Export: "e1"}},
		},
		NICs: []savedNIC{{ID: "eth0", MAC: "02:00:00:00:00:01"}}}
	args := strings.Join(buildArgs(spec, memorySource{path: "/m", shared: false}, testFDs, "", true), " ")
	for _, want := range []string{
		"microvm,pit=on",
		"-accel tcg,tb-size=256 -cpu max",
		"mem-path=/proc/self/fd/6,share=off",
		"-chardev file,id=console,append=on,path=/proc/self/fd/5",
		"-chardev socket,id=qmp,fd=4,server=on,wait=off -mon chardev=qmp,mode=control",
		"filename=/img,,with,,commas,read-only=on",
		"driver=nbd,node-name=data,server.type=unix,server.path=/run/nbd.sock,read-only=off,reconnect-delay=30,export=e1,discard=unmap",
		"tap,id=eth0,fd=3",
		"mac=02:00:00:00:00:01",
		"-incoming defer -S",
	} {
		if !strings.Contains(args, want) {
			t.Errorf("args lack %q:\n%s", want, args)
		}
	}
	if strings.Contains(args, "commas,read-only=on,cache.direct=off,discard") {
		t.Errorf("a read-only drive asks for discards:\n%s", args)
	}
	if a := strings.Join(buildArgs(spec, memorySource{path: "/m", shared: true}, testFDs, "", false), " "); strings.Contains(a, "-incoming") || strings.Contains(a, "-S") || !strings.Contains(a, "share=on") {
		t.Errorf("cold boot args wrong: %s", a)
	}
	// Version 1 snapshots' streams carry QEMU's configuration section and
	// self-description; newer ones neither.
	spec.Version = 1
	if a := strings.Join(buildArgs(spec, memorySource{path: "/m"}, testFDs, "", true), " "); strings.Contains(a, "send-configuration") || strings.Contains(a, "vmdesc") {
		t.Errorf("version 1 spec turns the configuration section off: %s", a)
	}
	spec.Version = specVersion
	if a := strings.Join(buildArgs(spec, memorySource{path: "/m"}, testFDs, "", true), " "); !strings.Contains(a, "-global migration.send-configuration=off") || !strings.Contains(a, "suppress-vmdesc=on") {
		t.Errorf("version %d spec keeps the configuration section: %s", spec.Version, a)
	}
	// The balloon (memory resize) is part of version 3 machines only: an
	// older snapshot's device set has none.
	for v, want := range map[int]bool{2: false, 3: true} {
		spec.Version = v
		a := strings.Join(buildArgs(spec, memorySource{path: "/m"}, testFDs, "", true), " ")
		if got := strings.Contains(a, "-device "+balloonDevice); got != want {
			t.Errorf("version %d spec: balloon device %v, want %v: %s", v, got, want, a)
		}
	}
}

func TestSparseCopy(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	const size = 64 << 20
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	// Data pages, an explicitly written zero page, and a page at the very end.
	page := bytes.Repeat([]byte{0xab}, pageSize)
	for _, off := range []int64{0, 5 * pageSize, 1 << 20, size - pageSize} {
		if _, err := f.WriteAt(page, off); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.WriteAt(make([]byte, pageSize), 6*pageSize); err != nil {
		t.Fatal(err)
	}
	f.Close()
	dst := filepath.Join(dir, "dst")
	written, err := sparseCopy(src, dst)
	if err != nil {
		t.Fatal(err)
	}
	if written != 4*pageSize {
		t.Errorf("wrote %d bytes of data, want %d (zero pages must become holes)", written, 4*pageSize)
	}
	a, _ := os.ReadFile(src)
	b, _ := os.ReadFile(dst)
	if !bytes.Equal(a, b) {
		t.Fatal("copy differs from source")
	}
	if _, err := sparseCopy(filepath.Join(dir, "missing"), dst); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("copy of a missing file: %v", err)
	}
}

func TestReadSpecRejectsBadSnapshots(t *testing.T) {
	t.Parallel()
	for name, content := range map[string]string{
		"garbage":    "{not json",
		"version":    `{"version": 99, "kernel": "/k", "vcpus": 1, "memoryMiB": 256}`,
		"incomplete": `{"version": 1}`,
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, vmm.SnapshotConfigFile), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := readSpec(dir); err == nil {
			t.Errorf("%s: readSpec accepted %q", name, content)
		}
	}
}

func TestMergeDevices(t *testing.T) {
	t.Parallel()
	img := filepath.Join(t.TempDir(), "img")
	if err := os.WriteFile(img, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	tap, _ := os.Open(os.DevNull)
	defer tap.Close()
	spec := func() *machineSpec {
		return &machineSpec{Drives: []vmm.Drive{{ID: "rootfs", Path: img}}, NICs: []savedNIC{{ID: "eth0", MAC: "02:00:00:00:00:01"}}}
	}
	ok := vmm.RestoreConfig{NICs: []vmm.NIC{{ID: "eth0", Tap: tap}}, Drives: []vmm.Drive{{ID: "rootfs", Path: img, ReadOnly: true}}}
	s := spec()
	if _, err := mergeDevices(s, ok); err != nil || !s.Drives[0].ReadOnly {
		t.Fatalf("valid override: %v %+v", err, s.Drives)
	}
	bad := map[string]vmm.RestoreConfig{
		"no tap":        {},
		"other mac":     {NICs: []vmm.NIC{{ID: "eth0", MAC: "02:00:00:00:00:02", Tap: tap}}},
		"unknown nic":   {NICs: []vmm.NIC{{ID: "eth0", Tap: tap}, {ID: "eth1", Tap: tap}}},
		"unknown drive": {NICs: []vmm.NIC{{ID: "eth0", Tap: tap}}, Drives: []vmm.Drive{{ID: "data", Path: img}}},
	}
	for name, rc := range bad {
		if _, err := mergeDevices(spec(), rc); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestCheckMemoryImage(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	short := filepath.Join(dir, "short")
	exact := filepath.Join(dir, "exact")
	for path, size := range map[string]int64{short: 16<<20 - pageSize, exact: 16 << 20} {
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(size); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	if err := checkMemoryImage(exact, 16); err != nil {
		t.Errorf("image of guest RAM size refused: %v", err)
	}
	if err := checkMemoryImage(short, 16); err == nil || !strings.Contains(err.Error(), "guest RAM is") {
		t.Errorf("short image: %v", err)
	}
	if err := checkMemoryImage(filepath.Join(dir, "missing"), 16); err == nil {
		t.Error("missing image accepted")
	}
	// A block device (a memory device of the storage daemon) is measured
	// by its end, not its stat size (zero): a loop device over exact.
	out, err := exec.Command("losetup", "--find", "--show", "--read-only", exact).Output()
	if err != nil {
		t.Skipf("no loop device for the block device case (losetup: %v)", err)
	}
	loop := strings.TrimSpace(string(out))
	defer exec.Command("losetup", "--detach", loop).Run()
	if err := checkMemoryImage(loop, 16); err != nil {
		t.Errorf("block device of guest RAM size refused: %v", err)
	}
	if err := checkMemoryImage(loop, 17); err == nil || !strings.Contains(err.Error(), "guest RAM is") {
		t.Errorf("block device smaller than guest RAM: %v", err)
	}
}

// TestRestoreDeviceSnapshotNeedsMemoryFile: a snapshot written without RAM
// names no memory image, so a restore without MemoryFile fails before
// starting anything.
func TestRestoreDeviceSnapshotNeedsMemoryFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := `{"version": 1, "kernel": "/k", "vcpus": 1, "memoryMiB": 256, "accel": "tcg", "noMemory": true}`
	if err := os.WriteFile(filepath.Join(dir, vmm.SnapshotConfigFile), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	// A memory file left in the directory must not be taken for its image.
	if err := os.WriteFile(filepath.Join(dir, vmm.SnapshotMemoryFile), make([]byte, pageSize), 0o600); err != nil {
		t.Fatal(err)
	}
	d := &Driver{accel: "tcg"}
	_, err := d.Restore(context.Background(), vmm.RestoreConfig{SnapshotDir: dir, RunDir: filepath.Join(dir, "run")})
	if err == nil || !strings.Contains(err.Error(), "MemoryFile is required") {
		t.Fatalf("restore of a device snapshot without MemoryFile: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "run")); !errors.Is(err, os.ErrNotExist) {
		t.Fatal("a refused restore created its run directory")
	}
}

// TestDriveSlots: an empty drive is a writable null device of size zero on
// QEMU's command line, and a restore puts a disk in its place.
func TestDriveSlots(t *testing.T) {
	t.Parallel()
	img := filepath.Join(t.TempDir(), "img")
	if err := os.WriteFile(img, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, want := blockdev(vmm.Drive{ID: "drive1", Empty: true}, ""), "driver=null-co,node-name=drive1,size=0,read-only=off"; got != want {
		t.Fatalf("empty slot: %q, want %q", got, want)
	}
	tap, _ := os.Open(os.DevNull)
	defer tap.Close()
	s := &machineSpec{Drives: []vmm.Drive{{ID: "rootfs", Path: img}, {ID: "drive1", Empty: true}, {ID: "drive2", Empty: true}},
		NICs: []savedNIC{{ID: "eth0", MAC: "02:00:00:00:00:01"}}}
	rc := vmm.RestoreConfig{NICs: []vmm.NIC{{ID: "eth0", Tap: tap}}, Drives: []vmm.Drive{{ID: "drive2", Path: img, ReadOnly: true}}}
	if _, err := mergeDevices(s, rc); err != nil {
		t.Fatalf("fill a slot: %v", err)
	}
	if !s.Drives[1].Empty || s.Drives[2].Empty || s.Drives[2].Path != img || !s.Drives[2].ReadOnly {
		t.Fatalf("drives after the restore's overrides: %+v", s.Drives)
	}
	if err := vmm.CheckDevices([]vmm.Drive{{ID: "drive1", Empty: true, Path: img}}, nil); err == nil {
		t.Fatal("an empty slot with a path was accepted")
	}
}

// TestConfinedArgs: a machine with RunAs drops to it in a chroot of its
// sockets' directory, names its NBD sockets relative to it, and only then
// allows the set*id calls its own drop makes.
func TestConfinedArgs(t *testing.T) {
	t.Parallel()
	spec := &machineSpec{Kernel: "/k", Cmdline: "c", VCPUs: 1, MemoryMiB: 256, Accel: "tcg",
		Drives: []vmm.Drive{
			{ID: "rootfs", NBD: &vmm.NBDSource{Socket: "/run/sd/nbd-3.sock"}},
			{ID: "drive1", NBD: &vmm.NBDSource{Socket: "/run/sd/nbd-4.sock"}},
		},
		RunAs: &vmm.Identity{UID: 2000000007, GID: 2000000007}}
	jail, err := jailOf(spec, "/run/vm", "/m", "/c")
	if err != nil || jail != "/run/sd" {
		t.Fatalf("jail %q, %v; want /run/sd", jail, err)
	}
	args := strings.Join(buildArgs(spec, memorySource{path: "/m"}, testFDs, jail, true), " ")
	for _, want := range []string{"-runas 2000000007:2000000007 -chroot /run/sd", "server.path=nbd-3.sock,", "server.path=nbd-4.sock,", "elevateprivileges=allow"} {
		if !strings.Contains(args, want) {
			t.Errorf("confined args lack %q:\n%s", want, args)
		}
	}
	spec.RunAs = nil
	if a := strings.Join(buildArgs(spec, memorySource{path: "/m"}, testFDs, "", true), " "); strings.Contains(a, "-runas") || !strings.Contains(a, "elevateprivileges=deny") || !strings.Contains(a, "server.path=/run/sd/nbd-3.sock") {
		t.Errorf("unconfined args: %s", a)
	}
	spec.Drives[1].NBD.Socket = "/elsewhere/nbd-4.sock"
	if _, err := jailOf(spec, "/run/vm"); err == nil {
		t.Error("drives whose sockets lie in two directories were given one jail")
	}
	spec.Drives = []vmm.Drive{{ID: "rootfs", Path: "rel/img"}}
	if _, err := jailOf(spec, "/run/vm"); err == nil {
		t.Error("a relative drive path was accepted for a machine that starts in its jail")
	}
	spec.Drives = []vmm.Drive{{ID: "rootfs", Path: "/img"}}
	if jail, err := jailOf(spec, "/run/vm"); err != nil || jail != "/run/vm" {
		t.Errorf("without NBD drives the jail is %q, %v; want the run dir", jail, err)
	}
}
