package vmtest

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/guest/agent/agentclient"
	"github.com/agentenv/agentenv/internal/testenv"
	"github.com/agentenv/agentenv/internal/testutil/guestassets"
	"github.com/agentenv/agentenv/storage/daemon/daemontest"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/image"
	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/vmm/qemu"
	"github.com/agentenv/agentenv/vmm/vmmtest"
)

// TestVMBootsFromDeviceAndRestacks boots a QEMU VM whose root filesystem is
// a daemon device (the guest rootfs imported as a sealed LSMT layer, plus a
// writable upper), writes a file in the guest, restacks the device while the
// VM runs, reads the file back through the new stack, and finally checks
// offline that the sealed layer holds the file.
func TestVMBootsFromDeviceAndRestacks(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces and taps")
	}
	for _, tool := range []string{"qemu-system-x86_64", "e2fsck", "debugfs"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Missing(t, "%s not installed (qemu-system-x86, e2fsprogs): %v", tool, err)
		}
	}
	a := guestassets.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	base := filepath.Join(dir, "rootfs.lsmt")
	if _, err := image.ImportRaw(ctx, a.Rootfs, base, image.CommitOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "rootfs.json")
	if err := (&image.Config{Lowers: []image.LayerRef{{File: base}}}).Save(cfg); err != nil {
		t.Fatal(err)
	}
	c := daemontest.Start(ctx, t)
	dev, err := c.Create(ctx, rpc.CreateParams{Image: cfg, Owner: "vm-test"})
	if err != nil {
		t.Fatal(err)
	}

	d, err := qemu.New(ctx, qemu.Options{ProbeKernel: a.Kernel})
	if err != nil {
		t.Fatal(err)
	}
	tn := vmmtest.NewTestNet(t)
	vm, err := d.Boot(ctx, vmm.Config{
		ID: "storaged", Kernel: a.Kernel, Initrd: a.Initrd, MemoryMiB: 256, RunDir: filepath.Join(dir, "run"),
		Cmdline: "root=/dev/vda rw quiet " + vmmtest.IPCmdline,
		Drives:  []vmm.Drive{{ID: "rootfs", NBD: &vmm.NBDSource{Socket: dev.Socket, Export: dev.Export}}},
		NICs:    []vmm.NIC{tn.NIC()},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Stop(context.Background())
	if err := tn.WaitHealthy(ctx); err != nil {
		console, _ := os.ReadFile(vm.Info().ConsoleLog)
		t.Fatalf("%v\n%s", err, console)
	}
	guest := func(script string) string {
		t.Helper()
		out, errOut, code, err := agentclient.Run(ctx, tn.AgentURL(), tn.HTTP, "/bin/sh", "-c", script)
		if err != nil || code != 0 {
			t.Fatalf("guest %q: err %v code %d out %q stderr %q", script, err, code, out, errOut)
		}
		return strings.TrimSpace(string(out))
	}
	guest("echo survives-restack > /var/tmp/restack.txt && sync")

	res, err := c.Restack(ctx, rpc.RestackParams{ID: dev.ID, Message: "vm test"})
	if err != nil {
		t.Fatal(err)
	}
	// Drop the guest's page cache so the read really comes from the device.
	got := guest("(echo 3 > /proc/sys/vm/drop_caches || sudo -n sh -c 'echo 3 > /proc/sys/vm/drop_caches') 2>/dev/null; " +
		"cat /var/tmp/restack.txt && echo after > /var/tmp/after.txt && sync && cat /var/tmp/after.txt")
	if got != "survives-restack\nafter" {
		t.Fatalf("guest reads %q after restack", got)
	}
	if err := vm.Stop(ctx); err != nil {
		t.Logf("stop: %v", err)
	}

	// Offline: flatten base + sealed layer, replay the ext4 journal, read the file.
	im, err := image.OpenLayers(ctx, []string{base, res.Layer}, image.Options{})
	if err != nil {
		t.Fatal(err)
	}
	raw := filepath.Join(dir, "sealed.raw")
	if err := image.Export(ctx, im, raw); err != nil {
		t.Fatal(err)
	}
	im.Close()
	if out, err := exec.Command("e2fsck", "-fy", raw).CombinedOutput(); err != nil {
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() > 1 { // 1: errors corrected (journal replay)
			t.Fatalf("e2fsck of the sealed stack: %v\n%s", err, out)
		}
	}
	out, err := exec.Command("debugfs", "-R", "cat /var/tmp/restack.txt", raw).Output()
	if err != nil || strings.TrimSpace(string(out)) != "survives-restack" {
		t.Fatalf("sealed layer does not hold the guest's file: %q %v", out, err)
	}
}
