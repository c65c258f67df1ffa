package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/aenvdtest"
	"github.com/agentenv/agentenv/storage/memfs/memfstest"
)

// TestSharedMemoryOverFUSE runs a node whose storage daemon exports memory
// stacks over FUSE (storage.shared_memory = "fuse"). A sandbox's VMM maps
// its memory from a file on the daemon's mount, and that descriptor takes
// no write, even from root (/proc/<qemu>/fdinfo names the mount, a write
// through it is refused): a VMM cannot change pages other VMs map. A pause
// and resume keep a file in tmpfs (guest memory) and one on disk, and the
// resumed VMM and a fork child map files of the same mount.
func TestSharedMemoryOverFUSE(t *testing.T) {
	nodePrereqs(t)
	memfstest.Require(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	n := ownNode(ctx, t, aenvdtest.Options{Prefix: "adfuse", CIDRBase: 101, Env: []string{"AENVD_STORAGE_SHARED_MEMORY=fuse"}})
	mount := filepath.Join(n.DataDir, "storaged", "run", "mem")
	id := n.create(t, `{"templateID":"base","timeout":600}`)
	checkMemoryOnMount(t, qemuOf(t, id), mount)
	n.sh(t, id, "echo in-memory > /dev/shm/m && echo on-disk > /root/d && sync")

	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, "")
	n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", n.key, `{"timeout":600}`)
	if got := n.sh(t, id, "cat /dev/shm/m /root/d"); got != "in-memory\non-disk" {
		t.Fatalf("after pause and resume on FUSE memory: %q", got)
	}
	checkMemoryOnMount(t, qemuOf(t, id), mount)

	b := n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/fork", n.key, `{"count":1,"timeout":300}`)
	child := forkChildID(t, b)
	t.Cleanup(func() { n.call(t, "DELETE", "/sandboxes/"+child, n.key, "") })
	if got := n.sh(t, child, "cat /dev/shm/m /root/d"); got != "in-memory\non-disk" {
		t.Fatalf("fork child on FUSE memory: %q", got)
	}
	checkMemoryOnMount(t, qemuOf(t, child), mount)
}

// forkChildID returns the one child a fork answer names.
func forkChildID(t *testing.T, body []byte) string {
	t.Helper()
	var kids []struct {
		Sandbox *sandboxJSON `json:"sandbox"`
	}
	if err := json.Unmarshal(body, &kids); err != nil || len(kids) != 1 || kids[0].Sandbox == nil || kids[0].Sandbox.SandboxID == "" {
		t.Fatalf("fork of one child: %s (%v)", body, err)
	}
	return kids[0].Sandbox.SandboxID
}

// checkMemoryOnMount: QEMU pid holds a descriptor of a file on the FUSE
// mount (its guest memory), fdinfo shows that mount, and a write through
// the descriptor is refused with EPERM.
func checkMemoryOnMount(t *testing.T, pid, mount string) {
	t.Helper()
	var mnt syscall.Stat_t
	if err := syscall.Stat(mount, &mnt); err != nil {
		t.Fatalf("the node's FUSE memory mount %s: %v", mount, err)
	}
	fds, err := os.ReadDir("/proc/" + pid + "/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		p := "/proc/" + pid + "/fd/" + fd.Name()
		var st syscall.Stat_t
		if syscall.Stat(p, &st) != nil || st.Dev != mnt.Dev || st.Mode&syscall.S_IFMT != syscall.S_IFREG {
			continue
		}
		info, err := os.ReadFile("/proc/" + pid + "/fdinfo/" + fd.Name())
		if err != nil || !strings.Contains(string(info), "mnt_id:") {
			t.Fatalf("fdinfo of QEMU %s's memory descriptor %s: %q %v", pid, fd.Name(), info, err)
		}
		f, err := os.OpenFile(p, os.O_WRONLY, 0)
		if err == nil {
			_, err = f.WriteAt([]byte("x"), 4096)
			f.Close()
		}
		if !errors.Is(err, syscall.EPERM) && !errors.Is(err, syscall.EACCES) {
			t.Fatalf("a write to QEMU %s's memory file (fd %s) was not refused: %v", pid, fd.Name(), err)
		}
		return
	}
	t.Fatalf("QEMU %s holds no file of the FUSE memory mount %s (device %d)", pid, mount, mnt.Dev)
}

// memoryExports reports whether the node's VMs map memory from the storage
// daemon's shared exports (/nodes memory mode "block-export").
func (n *node) memoryExports(t *testing.T) bool {
	t.Helper()
	var nodes []struct {
		Memory struct {
			Mode string `json:"mode"`
		} `json:"memory"`
	}
	if err := json.Unmarshal(n.expect(t, http.StatusOK, "GET", "/nodes", n.key, ""), &nodes); err != nil || len(nodes) != 1 {
		t.Fatalf("/nodes: %v", err)
	}
	return nodes[0].Memory.Mode == "block-export"
}

// onFUSEMemory reports whether the node maps memory from the storage
// daemon's FUSE mount (the default where FUSE exists and ublk does not).
func onFUSEMemory(t *testing.T, n *node, mount string) bool {
	t.Helper()
	var st, parent syscall.Stat_t
	if !n.memoryExports(t) || syscall.Stat(mount, &st) != nil || syscall.Stat(filepath.Dir(mount), &parent) != nil {
		t.Logf("the node maps no memory from a FUSE mount at %s", mount)
		return false
	}
	return st.Dev != parent.Dev
}
