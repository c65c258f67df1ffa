package vmmselect

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestSelectFallsBackToQEMU(t *testing.T) {
	kernel := filepath.Join(t.TempDir(), "vmlinuz")
	if err := os.WriteFile(kernel, []byte("k"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("AENV_QEMU_ACCEL", "tcg") // no probe boot in a unit test
	c, err := Select(context.Background(), Options{Firecracker: filepath.Join(t.TempDir(), "no-firecracker"), Kernel: kernel})
	if err != nil {
		t.Fatalf("select: %v (is qemu-system-x86 installed?)", err)
	}
	if c.Name != "qemu-tcg" || c.Driver.Name() != "qemu" || !strings.Contains(c.Reason, "firecracker unusable") {
		t.Fatalf("choice %+v", c)
	}
}

func TestSelectRejects(t *testing.T) {
	if _, err := Select(context.Background(), Options{Prefer: "bhyve"}); err == nil {
		t.Fatal("unknown driver accepted")
	}
	if _, err := Select(context.Background(), Options{Prefer: "firecracker", Firecracker: "/nonexistent/firecracker"}); err == nil {
		t.Fatal("firecracker selected without a binary")
	}
}
