package qemu_test

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
	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/vmm/qemu"
	"github.com/agentenv/agentenv/vmm/vmmtest"
)

// TestBootFromNBD boots the guest with its root filesystem served by a real
// NBD server (qemu-nbd) over a Unix socket, and a second, writable NBD drive.
func TestBootFromNBD(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces and taps")
	}
	if _, err := exec.LookPath("qemu-nbd"); err != nil {
		testenv.Missing(t, "qemu-nbd not installed (apt-get install qemu-utils)")
	}
	a := guestassets.Get(t)
	dir := t.TempDir()
	rootSock := serveNBD(t, dir, "root", a.Rootfs, true)
	data := filepath.Join(dir, "data.img")
	if err := os.WriteFile(data, make([]byte, 4<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	dataSock := serveNBD(t, dir, "data", data, false)

	ctx := context.Background()
	d, err := qemu.New(ctx, qemu.Options{ProbeKernel: a.Kernel})
	if err != nil {
		t.Fatal(err)
	}
	tn := vmmtest.NewTestNet(t)
	vm, err := d.Boot(ctx, vmm.Config{
		ID: "nbd", Kernel: a.Kernel, Initrd: a.Initrd, MemoryMiB: 256, RunDir: filepath.Join(dir, "run"),
		Cmdline: "root=/dev/vda ro quiet " + vmmtest.IPCmdline,
		Drives: []vmm.Drive{
			{ID: "rootfs", NBD: &vmm.NBDSource{Socket: rootSock}, ReadOnly: true},
			{ID: "data", NBD: &vmm.NBDSource{Socket: dataSock}},
		},
		NICs: []vmm.NIC{tn.NIC()},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Stop(ctx)
	rctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if err := tn.WaitHealthy(rctx); err != nil {
		console, _ := os.ReadFile(vm.Info().ConsoleLog)
		t.Fatalf("%v\n%s", err, console)
	}
	asRoot := []agentclient.Option{agentclient.WithUser("root")} // raw block device access
	out, errOut, code, err := agentclient.RunWith(rctx, tn.AgentURL(), tn.HTTP, asRoot, "/bin/sh", "-c",
		"echo hello-nbd | dd of=/dev/vdb bs=512 seek=8 conv=fsync 2>/dev/null && head -c 9 /etc/debian_version >/dev/null && echo ok")
	if err != nil || code != 0 || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("guest: err %v code %d out %q stderr %q", err, code, out, errOut)
	}
	_ = vm.Stop(ctx)
	b, err := os.ReadFile(data)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(b[8*512 : 8*512+9]); got != "hello-nbd" {
		t.Fatalf("the guest's write did not reach the NBD-served file: %q", got)
	}
}

func serveNBD(t *testing.T, dir, name, file string, readOnly bool) string {
	t.Helper()
	sock := filepath.Join(dir, name+".sock")
	cmd := startNBD(t, sock, file, readOnly, nil)
	t.Cleanup(func() { stopNBD(cmd) })
	return sock
}
