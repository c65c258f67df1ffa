package template_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/internal/crashdisk"
	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/template"
)

// TestBootFilesSurvivePowerLoss: once CopyBootFiles returns, a power loss
// leaves the template's kernel and initrd copies whole under their names
// (a record written next may name them); an armed template/boot/synced
// stops the copy after the files are durable.
func TestBootFilesSurvivePowerLoss(t *testing.T) {
	d := crashdisk.New(t, 64)
	src := t.TempDir()
	want := map[string][]byte{
		template.KernelFile: bytes.Repeat([]byte("kernel-bytes "), 200_000),
		template.InitrdFile: bytes.Repeat([]byte("initrd-bytes "), 90_000),
	}
	for name, b := range want {
		if err := os.WriteFile(filepath.Join(src, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(d.Root(), "templates", "tpl")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	kernel, initrd, err := template.CopyBootFiles(context.Background(), dir,
		filepath.Join(src, template.KernelFile), filepath.Join(src, template.InitrdFile))
	if err != nil {
		t.Fatal(err)
	}
	if kernel != filepath.Join(dir, template.KernelFile) || initrd != filepath.Join(dir, template.InitrdFile) {
		t.Fatalf("copies at %s, %s", kernel, initrd)
	}
	crashed := d.Crash()
	for name, b := range want {
		got, err := os.ReadFile(filepath.Join(crashed, "templates", "tpl", name))
		if err != nil || !bytes.Equal(got, b) {
			t.Fatalf("%s after a power loss: %d bytes of %d (%v)", name, len(got), len(b), err)
		}
	}

	if err := failpoint.Arm("template/boot/synced", "error"); err != nil {
		t.Fatal(err)
	}
	defer failpoint.Arm("template/boot/synced", "")
	_, _, err = template.CopyBootFiles(context.Background(), t.TempDir(),
		filepath.Join(src, template.KernelFile), filepath.Join(src, template.InitrdFile))
	if !errors.Is(err, failpoint.ErrInjected) {
		t.Fatalf("copy with template/boot/synced armed: %v, want the injected error", err)
	}
}
