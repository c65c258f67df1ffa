package daemon

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"

	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/memfs"
	"github.com/agentenv/agentenv/storage/memfs/memfstest"
	"golang.org/x/sys/unix"
)

// The FUSE row of the crash matrix: the daemon is killed with SIGKILL
// while a VMM (a child process here) maps a shared device's FUSE file.

// helperSharedEnv sets the helper daemon's SharedBlock.
const helperSharedEnv = "AENV_STORAGED_HELPER_SHARED"

// mapReaderEnv makes the test binary a mapping reader of the file it
// names (mapReaderMain).
const mapReaderEnv = "AENV_STORAGED_TEST_MAPREADER"

// TestCrashFUSEMapping: a daemon serving shared memory files over FUSE is
// killed with SIGKILL while a child maps a device's file and has read half
// of it; the child then faults on the other half while no daemon runs. A
// restarted daemon takes the mount over from the keeper and is killed
// before it serves (a failpoint); the next one takes it over, re-exports the
// device at the same path, and the child reads every byte right (a SIGBUS
// or a wrong byte fails it). A clean shutdown then unmounts and ends the
// keeper.
func TestCrashFUSEMapping(t *testing.T) {
	memfstest.Require(t)
	t.Setenv(helperSharedEnv, rpc.BlockFUSE)
	r := newCrashRun(t, newFixture(t, 33), nil)
	ctx, dir, fx := r.ctx, r.dir, r.fx
	mem, keeper := filepath.Join(dir, "run", rpc.SharedFileDir), filepath.Join(dir, "run", "mem.keeper")
	t.Cleanup(func() {
		if pid, err := memfs.KeeperPID(keeper); err == nil {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		unix.Unmount(mem, unix.MNT_DETACH)
	})
	r.spawn("")
	dev, err := r.c.Acquire(ctx, rpc.AcquireParams{Image: fx.config, Holder: "vm", Block: rpc.BlockFUSE})
	if err != nil {
		t.Fatal(err)
	}
	readerOut, readerIn, readerDone := startMapReader(t, dev.BlockDevice, fx.want)
	if line, err := readerOut.ReadString('\n'); err != nil || line != "half\n" {
		t.Fatalf("reader: %q %v: %v", line, err, <-readerDone)
	}

	r.cmd.Process.Signal(syscall.SIGKILL)
	if !r.crashed() {
		t.Fatalf("daemon did not die of SIGKILL: %v", r.err)
	}
	if ok, err := memfs.Mounted(mem); err != nil || !ok {
		t.Fatalf("mount gone with the daemon: %v %v", ok, err)
	}
	io.WriteString(readerIn, "go on\n") // faults while no daemon serves
	// A daemon that takes the mount over and dies before it serves (its
	// exports added back) leaves it to the next one all the same.
	crash := exec.CommandContext(ctx, os.Args[0])
	crash.Env = append(os.Environ(), helperEnv+"="+dir, failpoint.EnvVar+"=storaged-fuse/taken-over=crash")
	crash.Stderr = r.log
	var ee *exec.ExitError
	if err := crash.Run(); !errors.As(err, &ee) || !ee.Sys().(syscall.WaitStatus).Signaled() {
		t.Fatalf("daemon with a crash at storaged-fuse/taken-over: %v, want killed\n%s", err, r.logText())
	}
	r.c.Close()
	r.c = nil
	r.spawn("")
	if strings.Count(r.logText(), "took over the connection") != 2 {
		t.Fatalf("the restarted daemon did not take the mount over:\n%s", r.logText())
	}
	devs := r.list()
	if len(devs) != 1 || devs[0].BlockDevice != dev.BlockDevice {
		t.Fatalf("after restart: %+v, want %s", devs, dev.BlockDevice)
	}
	if err := <-readerDone; err != nil {
		t.Fatalf("reader across the kill: %v\n%s", err, r.logText())
	}

	if err := r.c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	<-r.done
	if r.err != nil {
		t.Fatalf("daemon exit after shutdown: %v", r.err)
	}
	if ok, _ := memfs.Mounted(mem); ok {
		t.Error("mount left after a clean shutdown")
	}
	if _, err := memfs.KeeperPID(keeper); err == nil {
		t.Error("keeper left after a clean shutdown")
	}
}

// startMapReader starts a child that maps path, checks its first half
// against want, says "half", waits for a line and checks the rest.
func startMapReader(t *testing.T, path string, want []byte) (*bufio.Reader, io.WriteCloser, chan error) {
	t.Helper()
	ref := filepath.Join(t.TempDir(), "want")
	if err := os.WriteFile(ref, want, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), mapReaderEnv+"="+path+":"+ref)
	var errBuf bytes.Buffer
	cmd.Stderr = &errBuf
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	br := bufio.NewReader(out)
	t.Cleanup(func() { cmd.Process.Kill() })
	go func() {
		err := cmd.Wait()
		if err != nil {
			err = fmt.Errorf("%w: %s", err, errBuf.String())
		}
		done <- err
	}()
	return br, in, done
}

// mapReaderMain is the reader child (no garbage collection: a fault that
// waits for a daemon must not hold up a stop-the-world).
func mapReaderMain(arg string) int {
	debug.SetGCPercent(-1)
	path, ref, _ := strings.Cut(arg, ":")
	err := func() error {
		want, err := os.ReadFile(ref)
		if err != nil {
			return err
		}
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			return err
		}
		defer f.Close()
		m, err := unix.Mmap(int(f.Fd()), 0, len(want), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
		if err != nil {
			return err
		}
		half := len(want) / 2
		if !bytes.Equal(m[:half], want[:half]) {
			return fmt.Errorf("first half differs")
		}
		fmt.Println("half")
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
			return err
		}
		for off := half; off < len(want); off += 4096 {
			if !bytes.Equal(m[off:off+4096], want[off:off+4096]) {
				return fmt.Errorf("page at %d differs", off)
			}
		}
		return nil
	}()
	if err != nil {
		fmt.Fprintln(os.Stderr, "map reader:", err)
		return 1
	}
	return 0
}
