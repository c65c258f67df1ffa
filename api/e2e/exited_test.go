package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestVMMExitKeepsDisk: a running sandbox whose VMM is killed (SIGKILL, as
// the kernel's OOM killer or a crash of QEMU ends it) is paused without its
// memory, which died with the VMM: GET names why (failure), the disk and a
// drive keep everything written (synced) before, a connect cold-boots the
// sandbox from them and the failure is cleared. A node restarted while a
// running sandbox's VMM is gone does the same (recovery), instead of
// dropping the sandbox.
func TestVMMExitKeepsDisk(t *testing.T) {
	n := sharedNode(t)
	t.Run("while the node serves", func(t *testing.T) {
		id := n.create(t, `{"templateID":"base","timeout":300,"drives":[{"sizeMiB":16}]}`)
		data := n.writeData(t, id, "exited")
		drive := n.writeDrive(t, id)
		killVMM(t, id)
		n.waitState(t, id, "paused", 2*time.Minute)
		if why := n.failure(t, id); !strings.Contains(why, "VMM exited") || !strings.Contains(why, "killed") {
			t.Fatalf("sandbox %s after its VMM was killed: failure %q, want the VMM's end named", id, why)
		}
		if files := n.memoryFiles(t, id); len(files) != 0 {
			t.Fatalf("sandbox %s paused after its VMM ended keeps memory files %v", id, files)
		}
		n.resumeAndCheck(t, id, data)
		n.checkDrive(t, id, "vmm killed", drive)
		if why := n.failure(t, id); why != "" {
			t.Fatalf("sandbox %s running again still reports failure %q", id, why)
		}
		n.checkNoOrphans(t)
	})
	t.Run("found gone by the next start", func(t *testing.T) {
		id := n.create(t, `{"templateID":"base","timeout":300}`)
		data := n.writeData(t, id, "gone")
		if err := n.Stop(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		killVMM(t, id)
		n.start(t)
		n.waitState(t, id, "paused", time.Second)
		if why := n.failure(t, id); !strings.Contains(why, "VMM was gone when the node started") {
			t.Fatalf("sandbox %s whose VMM was gone at the start: failure %q", id, why)
		}
		n.resumeAndCheck(t, id, data)
		n.checkNoOrphans(t)
	})
}

// crashExited: aenvd crashes at point while it keeps the disks of a sandbox
// whose VMM was killed (lifecycle.Verbs.PauseExited passes the pause's
// points); the next start finishes it, and the sandbox cold-boots with
// its data.
func (n *node) crashExited(t *testing.T, point string) {
	id := n.create(t, `{"templateID":"base","timeout":300}`)
	data := n.writeData(t, id, "ex")
	n.crashAt(t, point, func() { killVMM(t, id) })
	n.waitState(t, id, "paused", time.Second)
	if why := n.failure(t, id); why == "" {
		t.Fatalf("sandbox %s, whose VMM was killed, crashed at %s: no failure recorded", id, point)
	}
	n.resumeAndCheck(t, id, data)
}

// killVMM kills sandbox id's QEMU with SIGKILL and waits for it to be gone.
func killVMM(t *testing.T, id string) {
	t.Helper()
	pid, err := strconv.Atoi(qemuOf(t, id))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill the VMM of %s: %v", id, err)
	}
	for range 100 {
		// Gone, or a zombie its parent has not reaped yet (a VMM whose
		// aenvd is dead belongs to whoever adopts orphans).
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil || strings.Contains(string(stat), ") Z ") {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("the VMM %d of %s outlived SIGKILL", pid, id)
}

// failure is what GET /sandboxes/{id} says of why its VM ended ("" when
// nothing).
func (n *node) failure(t *testing.T, id string) string {
	t.Helper()
	var d struct {
		Failure string `json:"failure"`
	}
	if err := json.Unmarshal(n.expect(t, http.StatusOK, "GET", "/sandboxes/"+id, n.key, ""), &d); err != nil {
		t.Fatal(err)
	}
	return d.Failure
}
