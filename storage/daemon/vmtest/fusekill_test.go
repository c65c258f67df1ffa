package vmtest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/testenv"
	"github.com/agentenv/agentenv/storage/daemon"
	"github.com/agentenv/agentenv/storage/daemon/client"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/memfs"
	"github.com/agentenv/agentenv/storage/memfs/memfstest"
	"github.com/agentenv/agentenv/vmm/qemu"
	"golang.org/x/sys/unix"
)

// storagedEnv makes the test binary a storage daemon (FUSE shared memory
// exports) on the directory it names, so a test can kill it.
const storagedEnv = "AENV_VMTEST_STORAGED_DIR"

func storagedOptions(dir string) daemon.Options {
	return daemon.Options{
		Socket: filepath.Join(dir, "storaged.sock"), StateDir: filepath.Join(dir, "state"), RunDir: filepath.Join(dir, "run"),
		Logger: slog.New(slog.NewTextHandler(os.Stderr, nil)), SharedBlock: rpc.BlockFUSE,
	}
}

// storagedMain runs the daemon of storagedEnv until SIGTERM.
func storagedMain(dir string) int {
	d, err := daemon.New(storagedOptions(dir))
	if err == nil {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		defer stop()
		err = d.Run(ctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// spawnStoraged starts the daemon as a child and waits for its socket.
func spawnStoraged(ctx context.Context, t *testing.T, dir string, log *os.File) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), storagedEnv+"="+dir)
	cmd.Stderr = log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); <-done })
	for {
		c, err := client.Dial(ctx, storagedOptions(dir).Socket)
		if err == nil {
			c.Close()
			return cmd
		}
		select {
		case <-done:
			t.Fatal("storage daemon exited at start")
		case <-ctx.Done():
			t.Fatal("storage daemon did not come up")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestQEMUOnFUSEMemorySurvivesStoragedKill: a guest restored with its
// memory mapped from the daemon's FUSE file of its memory stack keeps
// running while the daemon is killed with SIGKILL and started again: the
// keeper held the mount, the new daemon took it over.
func TestQEMUOnFUSEMemorySurvivesStoragedKill(t *testing.T) {
	memfstest.Require(t)
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		testenv.Missing(t, "qemu-system-x86_64 not installed (qemu-system-x86): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	dir := t.TempDir()
	kernel, initrd := probeGuest(ctx, t)
	log, err := os.Create(filepath.Join(dir, "storaged.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	opts := storagedOptions(dir)
	t.Cleanup(func() {
		if pid, err := memfs.KeeperPID(filepath.Join(opts.RunDir, "mem.keeper")); err == nil {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		unix.Unmount(filepath.Join(opts.RunDir, rpc.SharedFileDir), unix.MNT_DETACH)
	})
	first := spawnStoraged(ctx, t, dir, log)
	c, err := client.Dial(ctx, opts.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	disk, _ := probeDisk(ctx, t, dir)
	d, err := qemu.New(ctx, qemu.Options{ProbeKernel: kernel})
	if err != nil {
		t.Fatal(err)
	}
	p := &probeRun{t: t, ctx: ctx, c: c, d: d, disk: disk, dir: dir}
	_, snap, base, tick := p.bootSnapshot(kernel, initrd)

	mem := p.sharedFile([]string{base}, "vm2")
	vm2 := p.restoreOn("vm2", snap, mem.BlockDevice)
	p.waitTickAbove(vm2, tick+2)

	var was unix.Stat_t
	if err := unix.Stat(mem.BlockDevice, &was); err != nil {
		t.Fatal(err)
	}
	first.Process.Signal(syscall.SIGKILL)
	first.Wait()
	before := p.lastTick(vm2)
	// An open while no daemon runs waits for the next one (on a mount
	// nobody held it would fail at once).
	opened := make(chan error, 1)
	var f *os.File
	go func() {
		var err error
		f, err = os.Open(mem.BlockDevice)
		opened <- err
	}()
	spawnStoraged(ctx, t, dir, log)
	if err := <-opened; err != nil {
		t.Fatalf("open across the restart: %v", err)
	}
	defer f.Close()
	var is unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &is); err != nil || is.Dev != was.Dev || is.Ino != was.Ino {
		t.Fatalf("the file after the restart is %d:%d (%v), was %d:%d: not the same mount", is.Dev, is.Ino, err, was.Dev, was.Ino)
	}
	// Pages the guest does not map leave the cache: reading them back
	// takes FUSE reads of the new daemon on the old mount.
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		t.Fatal(err)
	}
	p.waitTickAbove(vm2, before+3) // the guest goes on, its memory still mapped
	devs, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, dv := range devs {
		found = found || (dv.ID == mem.ID && dv.State == rpc.StateActive && dv.BlockDevice == mem.BlockDevice)
	}
	if !found {
		t.Fatalf("after the restart: %+v, want %s active at %s", devs, mem.Export, mem.BlockDevice)
	}
	vm2.Stop(ctx)
	p.checkDeviceHolds(mem.BlockDevice, []string{base})
	if logText, _ := os.ReadFile(log.Name()); !strings.Contains(string(logText), "took over the connection") {
		t.Fatalf("the restarted daemon did not take the mount over:\n%s", logText)
	}
}
