package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/config"
)

// fakeCgroup2 makes a directory standing for a unified hierarchy with the
// three controllers and a mount table naming it.
func fakeCgroup2(t *testing.T, root string) string {
	t.Helper()
	if err := os.WriteFile(filepath.Join(root, "cgroup.controllers"), []byte("cpuset cpu io memory pids\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mi := filepath.Join(t.TempDir(), "mountinfo")
	line := fmt.Sprintf("30 22 0:27 / %s rw,relatime - cgroup2 cgroup2 rw\n", root)
	if err := os.WriteFile(mi, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	return mi
}

func TestPreflightAcceptsWhatTheHostHas(t *testing.T) {
	cfg := config.Default()
	h := hostPaths{kvm: "/dev/null", ublkControl: "/dev/null", mountinfo: fakeCgroup2(t, t.TempDir())}
	cfg.VMM.Accel = "kvm"
	if err := preflight(cfg, true, h); err != nil {
		t.Fatalf("a host with every device and a writable hierarchy refused: %v", err)
	}
	// The defaults need neither KVM nor ublk.
	h.kvm, h.ublkControl = "/nonexistent/kvm", "/nonexistent/ublk-control"
	if err := preflight(config.Default(), false, h); err != nil {
		t.Fatalf("the default configuration refused on a host without KVM and ublk: %v", err)
	}
}

func TestPreflightRefusesKVMWithoutDevice(t *testing.T) {
	cfg := config.Default()
	cfg.VMM.Accel = "kvm"
	cfg.Sandbox.Cgroups = false
	notDevice := filepath.Join(t.TempDir(), "kvm")
	if err := os.WriteFile(notDevice, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	for _, kvm := range []string{"/nonexistent/kvm", notDevice} {
		err := preflight(cfg, false, hostPaths{kvm: kvm})
		if err == nil || !strings.Contains(err.Error(), `vmm.accel = "kvm" needs a usable `+kvm) {
			t.Fatalf("accel kvm with %s: %v", kvm, err)
		}
	}
	cfg.VMM.Accel = "tcg"
	if err := preflight(cfg, false, hostPaths{kvm: "/nonexistent/kvm"}); err != nil {
		t.Fatalf("accel tcg refused without KVM: %v", err)
	}
}

func TestPreflightRefusesMemoryDevicesWithoutUblk(t *testing.T) {
	cfg := config.Default()
	cfg.Sandbox.Cgroups = false
	h := hostPaths{ublkControl: "/nonexistent/ublk-control"}
	err := preflight(cfg, true, h)
	if err == nil || !strings.Contains(err.Error(), "storage.memory_devices = true needs the ublk driver") {
		t.Fatalf("memory devices set without ublk: %v", err)
	}
	// FUSE exports serve memory devices without ublk, where FUSE is usable.
	cfg.Storage.SharedMemory = "fuse"
	if err := preflight(cfg, true, hostPaths{ublkControl: "/nonexistent/ublk-control", fuse: "/dev/null"}); err != nil {
		t.Fatalf("memory devices over FUSE refused: %v", err)
	}
	if err := preflight(cfg, true, hostPaths{ublkControl: "/nonexistent/ublk-control", fuse: "/nonexistent/fuse"}); err == nil {
		t.Fatal("memory devices over FUSE without a FUSE device admitted")
	}
	cfg.Storage.SharedMemory = ""
	cfg.Storage.Backend = "files"
	if err := preflight(cfg, true, hostPaths{ublkControl: "/dev/null"}); err == nil || !strings.Contains(err.Error(), `needs storage.backend = "storaged"`) {
		t.Fatalf("memory devices set on the files backend: %v", err)
	}
	cfg.Storage.MemoryDevices = false
	if err := preflight(cfg, true, h); err != nil {
		t.Fatalf("memory_devices = false refused: %v", err)
	}
}

func TestPreflightRefusesReadOnlyCgroups(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: mounts a read-only tmpfs as the hierarchy")
	}
	root := t.TempDir()
	if err := unix.Mount("tmpfs", root, "tmpfs", 0, "size=1m"); err != nil {
		t.Skipf("cannot mount a tmpfs here: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(root, unix.MNT_DETACH) })
	mi := fakeCgroup2(t, root)
	cfg := config.Default()
	cfg.VMM.Accel = "kvm"
	h := hostPaths{kvm: "/nonexistent/kvm", mountinfo: mi}
	if err := preflight(cfg, false, h); err == nil || strings.Contains(err.Error(), "cgroups") {
		t.Fatalf("a writable hierarchy: want only the KVM error, got %v", err)
	}
	if err := unix.Mount("", root, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("remount %s read-only: %v", root, err)
	}
	err := preflight(cfg, false, h)
	if err == nil || !strings.Contains(err.Error(), "sandbox.cgroups = true: cgroup: the cpu hierarchy at "+root+" is mounted read-only") {
		t.Fatalf("a read-only hierarchy: %v", err)
	}
	// Both refusals in one error.
	if !strings.Contains(err.Error(), `vmm.accel = "kvm"`) {
		t.Fatalf("the KVM refusal is missing from %v", err)
	}
	cfg.Sandbox.Cgroups = false
	cfg.VMM.Accel = ""
	if err := preflight(cfg, false, h); err != nil {
		t.Fatalf("cgroups off refused on a read-only hierarchy: %v", err)
	}
}
