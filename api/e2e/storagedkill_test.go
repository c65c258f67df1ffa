package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/storage/daemon/client"
)

// The storage daemon killed alone while aenvd and its VMs run on.

// storagedProcess returns the pid and command line of the node's storage
// daemon (0 when none runs).
func (n *node) storagedProcess() (int, []string) {
	sock := filepath.Join(n.DataDir, "storaged", "storaged.sock")
	for _, p := range processesMentioning(sock) {
		b, _ := os.ReadFile("/proc/" + p + "/cmdline")
		st, _ := os.ReadFile("/proc/" + p + "/stat")
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if strings.HasSuffix(args[0], "aenv-storaged") && !strings.Contains(string(st), ") Z ") {
			pid, _ := strconv.Atoi(p)
			return pid, args
		}
	}
	return 0, nil
}

// startStoraged starts the storage daemon again as a service manager would
// (same arguments, its own session), with extra environment.
func startStoraged(t *testing.T, args []string, env ...string) {
	t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start aenv-storaged: %v", err)
	}
	go cmd.Wait() // reaped when it ends; the node shuts it down at the end
}

// waitStoraged waits until the storage daemon answers.
func (n *node) waitStoraged(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := client.Dial(t.Context(), filepath.Join(n.DataDir, "storaged", "storaged.sock"))
		if err == nil {
			_, err = c.List(t.Context())
			c.Close()
			if err == nil {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("aenv-storaged does not answer: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// killStoraged SIGKILLs the storage daemon and waits until it is gone.
func killStoraged(t *testing.T, pid int) {
	t.Helper()
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for i := 0; i < 100; i++ {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
			return
		}
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if strings.Contains(string(b), ") Z ") {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("aenv-storaged %d did not die", pid)
}

// answeredNotFlushed kills the storage daemon right after the guest wrote
// a new file with O_DIRECT: the daemon answered the writes, no flush
// covered them (the guest's ext4 commits its journal, which flushes, every
// 5 s; the sync before starts a fresh transaction). The guest's flush after
// the restart goes to the new daemon, and the file must read back: the
// writes needed new space in the disk's upper, whose mappings a daemon
// used to lose with its process.
func answeredNotFlushed(t *testing.T, n *node, id string, args []string) {
	t.Helper()
	sum := n.sh(t, id, `set -e; head -c 4194304 /dev/urandom > /dev/shm/direct; sync
dd if=/dev/shm/direct of=/home/user/direct bs=1M oflag=direct status=none; sha256sum < /dev/shm/direct`)
	pid, _ := n.storagedProcess()
	killStoraged(t, pid)
	startStoraged(t, args)
	n.waitStoraged(t)
	got := n.sh(t, id, `sync; echo 3 > /proc/sys/vm/drop_caches; sha256sum < /home/user/direct`)
	if got != sum {
		t.Fatalf("a file written with O_DIRECT just before the storage daemon was killed reads %q after a sync through the new daemon, want %q", got, sum)
	}
	n.sh(t, id, `rm /home/user/direct /dev/shm/direct`)
}

// TestStoragedKill9 kills the storage daemon alone (aenvd and the VM run
// on): once at rest, and at each fault point of a restack it is crashed at
// (a snapshot's disk seal, which restacks, or a pause's, which keeps the
// device's upper). Started again as a service manager would, it
// takes its devices back; the guest's disk waits for it (NBD reconnect)
// and loses nothing, and the sandbox pauses and resumes with its data.
func TestStoragedKill9(t *testing.T) {
	n := sharedNode(t)
	id := n.create(t, `{"templateID":"base","timeout":600}`)
	data := []guestData{n.writeData(t, id, "k0")}
	pid, args := n.storagedProcess()
	if pid == 0 {
		t.Fatal("no aenv-storaged process serves the node")
	}
	killStoraged(t, pid)
	startStoraged(t, args)
	data = append(data, n.writeData(t, id, "k1"))
	n.checkData(t, id, data...)
	answeredNotFlushed(t, n, id, args)

	points := append(failpoint.Names("storaged/restack/"), failpoint.Names("storaged/seal/")...)
	if len(points) == 0 {
		t.Fatal("the storage daemon declares no restack fault points")
	}
	for i, point := range points {
		pid, _ := n.storagedProcess()
		killStoraged(t, pid)
		startStoraged(t, args, failpoint.EnvVar+"="+point+"=crash")
		n.waitStoraged(t)
		// The seal crashes the daemon: the snapshot or pause fails and the
		// sandbox runs on (or, past the restack's record, it may succeed).
		if strings.HasPrefix(point, "storaged/seal/") {
			_, _, _, _ = n.Call("POST", "/sandboxes/"+id+"/pause", n.key, "")
		} else if code, b, _, _ := n.Call("POST", "/sandboxes/"+id+"/snapshots", n.key, `{}`); code == http.StatusCreated {
			var snap snapshotJSON
			if json.Unmarshal([]byte(b), &snap) == nil {
				t.Cleanup(func() { n.call(t, "DELETE", "/snapshots/"+snap.SnapshotID, n.key, "") })
			}
		}
		deadline := time.Now().Add(time.Minute)
		for p, _ := n.storagedProcess(); p != 0; p, _ = n.storagedProcess() {
			if time.Now().After(deadline) {
				t.Fatalf("aenv-storaged armed with %s=crash survived a pause", point)
			}
			time.Sleep(100 * time.Millisecond)
		}
		startStoraged(t, args)
		n.waitStoraged(t)
		n.resumeAndCheck(t, id, data...)
		data = append(data, n.writeData(t, id, fmt.Sprintf("k%d", i+2)))
		n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, "")
		n.resumeAndCheck(t, id, data...)
	}
	n.checkNoOrphans(t)
}
