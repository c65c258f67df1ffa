package qemu_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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

// TestConfinedMachine: a machine with RunAs runs as that uid and gid, with
// no capability, no_new_privs and the seccomp filter, chrooted into its
// sockets' directory; its NBD disk still works after the NBD server is
// restarted (QEMU reconnects from inside the jail as the unprivileged uid).
func TestConfinedMachine(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces, taps and a uid to drop to")
	}
	if _, err := exec.LookPath("qemu-nbd"); err != nil {
		testenv.Missing(t, "qemu-nbd not installed (apt-get install qemu-utils)")
	}
	a := guestassets.Get(t)
	dir := t.TempDir()
	jail := filepath.Join(dir, "sockets")
	if err := os.Mkdir(jail, 0o711); err != nil {
		t.Fatal(err)
	}
	id := vmm.Identity{UID: 2000100000 + uint32(os.Getpid()%1000), GID: 2000100000 + uint32(os.Getpid()%1000)}
	data := filepath.Join(dir, "data.img")
	if err := os.WriteFile(data, make([]byte, 4<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	root := startNBD(t, filepath.Join(jail, "root.sock"), a.Rootfs, true, &id)
	defer stopNBD(root)
	dataNBD := startNBD(t, filepath.Join(jail, "data.sock"), data, false, &id)
	defer func() { stopNBD(dataNBD) }()

	ctx := context.Background()
	d, err := qemu.New(ctx, qemu.Options{ProbeKernel: a.Kernel})
	if err != nil {
		t.Fatal(err)
	}
	tn := vmmtest.NewTestNet(t)
	vm, err := d.Boot(ctx, vmm.Config{
		ID: "confined", Kernel: a.Kernel, Initrd: a.Initrd, MemoryMiB: 256, RunDir: filepath.Join(dir, "run"),
		Cmdline: "root=/dev/vda ro quiet " + vmmtest.IPCmdline,
		Drives: []vmm.Drive{
			{ID: "rootfs", NBD: &vmm.NBDSource{Socket: filepath.Join(jail, "root.sock")}, ReadOnly: true},
			{ID: "data", NBD: &vmm.NBDSource{Socket: filepath.Join(jail, "data.sock")}},
		},
		NICs: []vmm.NIC{tn.NIC()}, RunAs: &id,
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
	pid := vm.Info().PID
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		fmt.Sprintf("\nUid:\t%d\t%[1]d\t%[1]d\t%[1]d\n", id.UID), fmt.Sprintf("\nGid:\t%d\t%[1]d\t%[1]d\t%[1]d\n", id.GID),
		"\nCapEff:\t0000000000000000\n", "\nNoNewPrivs:\t1\n", "\nSeccomp:\t2\n",
	} {
		if !strings.Contains(string(status), want) {
			t.Errorf("QEMU %d's status lacks %q:\n%s", pid, strings.TrimSpace(want), status)
		}
	}
	if got, err := os.Readlink(fmt.Sprintf("/proc/%d/root", pid)); err != nil || got != jail {
		t.Errorf("QEMU %d's root is %q (%v), want its jail %s", pid, got, err, jail)
	}
	if ns, own := mountNS(t, fmt.Sprint(pid)), mountNS(t, "self"); ns == own {
		t.Errorf("QEMU %d shares the mount namespace %s of its starter", pid, ns)
	}
	// Its network is a namespace of its own: the tap came as a descriptor.
	if err := vmmtest.NetworkAlone(pid); err != nil {
		t.Error(err)
	}
	// That namespace holds what QEMU needs and nothing else of the host.
	mounts, err := vmmtest.NamespaceMounts(pid)
	if err != nil {
		t.Fatal(err)
	}
	if extra := vmmtest.JailMountsExtra(mounts, jail, a.Kernel, a.Initrd); len(extra) > 0 {
		t.Errorf("QEMU %d's mount namespace holds more than it needs: %v (all: %v)", pid, extra, mounts)
	}
	for _, want := range []string{jail, a.Kernel, "/usr", "/proc"} {
		if !slices.Contains(mounts, want) {
			t.Errorf("QEMU %d's mount namespace lacks %s (all: %v)", pid, want, mounts)
		}
	}

	write := func(word string) {
		t.Helper()
		asRoot := []agentclient.Option{agentclient.WithUser("root")}
		script := fmt.Sprintf("echo %s | dd of=/dev/vdb bs=512 seek=8 oflag=direct conv=fsync 2>&1 && echo ok", word)
		out, errOut, code, err := agentclient.RunWith(rctx, tn.AgentURL(), tn.HTTP, asRoot, "/bin/sh", "-c", script)
		if err != nil || code != 0 || !strings.HasSuffix(strings.TrimSpace(string(out)), "ok") {
			t.Fatalf("guest write %s: err %v code %d out %q stderr %q", word, err, code, out, errOut)
		}
	}
	write("before-restart")
	stopNBD(dataNBD)
	dataNBD = startNBD(t, filepath.Join(jail, "data.sock"), data, false, &id)
	write("after-restart") // waits for QEMU's reconnect (reconnect-delay)
	_ = vm.Stop(ctx)
	b, err := os.ReadFile(data)
	if err != nil {
		t.Fatal(err)
	}
	if got := string(b[8*512 : 8*512+13]); got != "after-restart" {
		t.Fatalf("the write after the NBD server's restart did not reach the file: %q", got)
	}
}

// startNBD serves file with qemu-nbd on sock (a fresh socket, as a
// restarted server makes), owned by id when set: the one identity besides
// root that may connect.
func startNBD(t *testing.T, sock, file string, readOnly bool, id *vmm.Identity) *exec.Cmd {
	t.Helper()
	_ = os.Remove(sock)
	args := []string{"--socket", sock, "--format", "raw", "--persistent", "--shared", "4"}
	if readOnly {
		args = append(args, "--read-only")
	}
	cmd := exec.Command("qemu-nbd", append(args, file)...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 200; i++ {
		if _, err := os.Stat(sock); err == nil {
			if id != nil {
				chownSocket(t, sock, *id)
			}
			return cmd
		}
		time.Sleep(25 * time.Millisecond)
	}
	stopNBD(cmd)
	t.Fatalf("qemu-nbd did not create %s", sock)
	return nil
}

func chownSocket(t *testing.T, sock string, id vmm.Identity) {
	t.Helper()
	if err := os.Chown(sock, int(id.UID), int(id.GID)); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(sock, 0o600); err != nil {
		t.Fatal(err)
	}
}

func stopNBD(cmd *exec.Cmd) {
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

// mountNS names the mount namespace of process pid ("self": this one).
func mountNS(t *testing.T, pid string) string {
	t.Helper()
	ns, err := os.Readlink("/proc/" + pid + "/ns/mnt")
	if err != nil {
		t.Fatal(err)
	}
	return ns
}
