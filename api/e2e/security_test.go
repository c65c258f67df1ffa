package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/vmm/vmmtest"
)

// TestAgentTokenAlways: a sandbox created without "secure" still has an
// agent that refuses requests without its token (only the proxy holds and
// presents it, and the API never shows it), so a connection that got past
// the node's network rules, even from inside the guest, gets nothing.
func TestAgentTokenAlways(t *testing.T) {
	n := sharedNode(t)
	id := n.create(t, `{"templateID":"base","timeout":120}`)
	var d struct {
		EnvdAccessToken *string `json:"envdAccessToken"`
	}
	if err := json.Unmarshal(n.expect(t, http.StatusOK, "GET", "/sandboxes/"+id, n.key, ""), &d); err != nil {
		t.Fatal(err)
	}
	if d.EnvdAccessToken != nil {
		t.Fatalf("a non-secure sandbox's details show an agent token")
	}
	// Through the proxy the agent works (the proxy presents the token) ...
	if got := n.sh(t, id, `echo through-the-proxy`); got != "through-the-proxy" {
		t.Fatalf("command through the proxy: %q", got)
	}
	// ... but a request that reaches the agent directly carries none.
	code := n.sh(t, id, `curl -s -o /dev/null -w '%{http_code}' -X POST -H 'Content-Type: application/json' -d '{}' http://127.0.0.1:49983/process.Process/List`)
	if code != "401" {
		t.Fatalf("the agent answered %s to a request without its token, want 401", code)
	}
}

// TestVMMConfined: a sandbox's QEMU runs under a seccomp filter, in a
// control group of its own (named by a digest of the VM, sandbox.GroupName, under the node's prefix) with
// the sandbox's memory plus the VMM's share and a pids bound, and the group
// goes with the sandbox.
func TestVMMConfined(t *testing.T) {
	n := sharedNode(t)
	id := n.create(t, `{"templateID":"base","timeout":120}`)
	var info struct {
		MemoryMB int64 `json:"memoryMB"`
	}
	if err := json.Unmarshal(n.expect(t, http.StatusOK, "GET", "/sandboxes/"+id, n.key, ""), &info); err != nil || info.MemoryMB == 0 {
		t.Fatalf("sandbox info: %+v %v", info, err)
	}
	pid := qemuOf(t, id)
	status, _ := os.ReadFile("/proc/" + pid + "/status")
	if !strings.Contains(string(status), "\nSeccomp:\t2\n") {
		t.Fatalf("QEMU %s runs without a seccomp filter:\n%s", pid, status)
	}
	checkUnprivileged(t, pid, string(status))
	checkDescriptors(t, pid, n.DataDir)
	// Its guest memory is the storage daemon's shared export of the
	// template's stack, which takes no write: a VMM taken over by its guest
	// cannot change the pages every other sandbox of the template maps.
	if mount := filepath.Join(n.DataDir, "storaged", "run", "mem"); onFUSEMemory(t, n, mount) {
		checkMemoryOnMount(t, pid, mount)
	}
	// Its command line, which every local user reads in ps, names no sandbox.
	if cmd, _ := os.ReadFile("/proc/" + pid + "/cmdline"); len(cmd) == 0 || strings.Contains(string(cmd), id) {
		t.Errorf("QEMU %s's command line names its sandbox %s: %s", pid, id, strings.ReplaceAll(string(cmd), "\x00", " "))
	}
	// A second sandbox's VMM runs as an identity of its own.
	other := n.create(t, `{"templateID":"base","timeout":120}`)
	otherStatus, _ := os.ReadFile("/proc/" + qemuOf(t, other) + "/status")
	if uid, otherUID := statusField(string(status), "Uid"), statusField(string(otherStatus), "Uid"); uid == otherUID {
		t.Errorf("the VMMs of two sandboxes share uid %s", uid)
	}
	n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+other, n.key, "")
	groups := cgroupsOf(t, pid)
	for _, c := range []string{"cpu", "memory", "pids"} {
		if !strings.Contains(groups[c], "/aenv/adtest/"+sandbox.GroupName(id+"-1")) {
			t.Fatalf("QEMU %s's %s group is %q, not its own (%s)", pid, c, groups[c], sandbox.GroupName(id+"-1"))
		}
	}
	mem := groupFile(t, "memory", groups["memory"], "memory.limit_in_bytes", "memory.max")
	if want := []string{fmt.Sprint((info.MemoryMB + int64(sandbox.VMMOverheadMiB("tcg"))) << 20), fmt.Sprint((info.MemoryMB + int64(sandbox.VMMOverheadMiB("kvm"))) << 20)}; !slices.Contains(want, mem) {
		t.Errorf("memory limit %s, want one of %v (guest %d MiB + the VMM's share)", mem, want, info.MemoryMB)
	}
	if got := groupFile(t, "pids", groups["pids"], "pids.max", "pids.max"); got != "512" {
		t.Errorf("pids limit %s, want 512", got)
	}
	n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, n.key, "")
	if dir := groupDir(t, "pids", groups["pids"]); fileExists(dir) {
		t.Fatalf("the control group %s outlives its sandbox", dir)
	}
}

// checkUnprivileged: QEMU pid runs as a uid and gid other than root's, with
// no capability and no_new_privs, chrooted into the storage daemon's socket
// directory (its disks' sockets are all it can reach).
func checkUnprivileged(t *testing.T, pid, status string) {
	t.Helper()
	for _, f := range []string{"Uid", "Gid"} {
		ids := strings.Fields(statusField(status, f))
		if len(ids) != 4 || slices.Contains(ids, "0") || len(slices.Compact(slices.Clone(ids))) != 1 {
			t.Errorf("QEMU %s: %s %v, want one unprivileged id", pid, f, ids)
		}
	}
	if statusField(status, "CapEff") != "0000000000000000" || statusField(status, "NoNewPrivs") != "1" {
		t.Errorf("QEMU %s keeps capabilities %s (no_new_privs %s)", pid, statusField(status, "CapEff"), statusField(status, "NoNewPrivs"))
	}
	root, err := os.Readlink("/proc/" + pid + "/root")
	if err != nil || root == "/" {
		t.Errorf("QEMU %s is not chrooted: root %q (%v)", pid, root, err)
	}
	if ns, own := readLink("/proc/"+pid+"/ns/mnt"), readLink("/proc/self/ns/mnt"); ns == "" || ns == own {
		t.Errorf("QEMU %s runs in the mount namespace %q of the node, not its own", pid, ns)
	}
	if n, err := strconv.Atoi(pid); err != nil {
		t.Errorf("QEMU pid %q: %v", pid, err)
	} else if err := vmmtest.NetworkAlone(n); err != nil {
		t.Error(err)
	}
	checkJailMounts(t, pid, root)
	// Its disk's socket lies there, made its own (it reconnects as itself
	// after a restart of the storage daemon).
	uid := strings.Fields(statusField(status, "Uid"))
	socks, _ := filepath.Glob(filepath.Join(root, "nbd-*.sock"))
	owned := 0
	for _, sock := range socks {
		if fi, err := os.Stat(sock); err == nil && len(uid) > 0 && fmt.Sprint(fi.Sys().(*syscall.Stat_t).Uid) == uid[0] && fi.Mode().Perm() == 0o600 {
			owned++
		}
	}
	if owned == 0 {
		t.Errorf("QEMU %s's root %s holds no 0600 disk socket of its uid %v (sockets %v)", pid, root, uid, socks)
	}
}

// checkJailMounts: QEMU pid's mount namespace holds what it needs and
// nothing else of the host: its chroot (root), the kernel and initrd its
// command line names, the system's program directories, /proc and devices.
func checkJailMounts(t *testing.T, pid, root string) {
	t.Helper()
	n, _ := strconv.Atoi(pid)
	mounts, err := vmmtest.NamespaceMounts(n)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile("/proc/" + pid + "/cmdline")
	args := strings.Split(string(raw), "\x00")
	given := []string{root}
	for i, a := range args {
		if (a == "-kernel" || a == "-initrd") && i+1 < len(args) {
			given = append(given, args[i+1])
		}
	}
	if extra := vmmtest.JailMountsExtra(mounts, given...); len(extra) > 0 || !slices.Contains(mounts, root) {
		t.Errorf("QEMU %s's mount namespace holds %v beyond what it needs (its jail %s; all: %v)", pid, extra, root, mounts)
	}
}

// statusField is the value of a /proc/PID/status line.
func statusField(status, name string) string {
	for _, l := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(l, name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// qemuOf returns the pid of the QEMU process of sandbox id.
func qemuOf(t *testing.T, id string) string {
	t.Helper()
	for _, p := range processesMentioning(id) {
		cmd, _ := os.ReadFile("/proc/" + p + "/cmdline")
		if strings.Contains(string(cmd), "qemu-system") {
			return p
		}
	}
	t.Fatalf("no QEMU process of sandbox %s", id)
	return ""
}

// cgroupsOf maps the cpu, memory and pids controllers to the process's
// group path (v1 lines name the controller; v2's "0::" holds for all).
func cgroupsOf(t *testing.T, pid string) map[string]string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + pid + "/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(l, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = parts[2]
		}
	}
	for _, c := range []string{"cpu", "memory", "pids"} {
		if out[c] == "" || out[c] == "/" {
			out[c] = out[""] // cgroup v2
		}
	}
	return out
}

// groupDir finds the directory of group path in controller c's hierarchy:
// its v1 hierarchy where one is mounted, else the unified one.
func groupDir(t *testing.T, c, path string) string {
	t.Helper()
	root := "/sys/fs/cgroup/" + c
	if _, err := os.Stat(filepath.Join(root, "cgroup.procs")); err != nil {
		root = "/sys/fs/cgroup"
	}
	return filepath.Join(root, path)
}

// groupFile reads a limit of the group (v1 file name, else v2's).
func groupFile(t *testing.T, c, path, v1, v2 string) string {
	t.Helper()
	dir := groupDir(t, c, path)
	for _, f := range []string{v1, v2} {
		if b, err := os.ReadFile(filepath.Join(dir, f)); err == nil {
			return strings.TrimSpace(string(b))
		}
	}
	t.Fatalf("no %s or %s in %s", v1, v2, dir)
	return ""
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// checkDescriptors: QEMU pid holds only what it was handed or opened for
// its VM: its tap, files of the node's data dir, sockets, event and signal
// descriptors, /dev/null. A pipe or another file is one leaked to it (a
// descriptor aenvd inherited from its own parent).
func checkDescriptors(t *testing.T, pid, dataDir string) {
	t.Helper()
	fds, err := os.ReadDir("/proc/" + pid + "/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		target, err := os.Readlink("/proc/" + pid + "/fd/" + fd.Name())
		if err != nil {
			continue // closed meanwhile
		}
		ok := target == os.DevNull || target == "/dev/net/tun" || strings.HasPrefix(target, dataDir+"/") ||
			strings.HasPrefix(target, "socket:") || strings.HasPrefix(target, "anon_inode:")
		if !ok {
			t.Errorf("QEMU %s holds descriptor %s -> %s, which nobody handed it", pid, fd.Name(), target)
		}
	}
}

// TestStateFilesPrivate: after a sandbox's whole lifecycle (create, write,
// pause, resume, snapshot, kill) no file below the node's data dir is
// readable or writable by anyone but its owner: layers, memory images,
// records, device configs, logs and sockets are 0600 (the data dir's own
// 0700 is the first fence, this is the second). The only exception is the
// proxy's CA certificate, which is public by design.
func TestStateFilesPrivate(t *testing.T) {
	n := sharedNode(t)
	id := n.create(t, `{"templateID":"base","timeout":120}`)
	data := n.writeData(t, id, "private")
	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, "")
	n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", n.key, `{"timeout":120}`)
	n.checkData(t, id, data)
	n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/snapshots", n.key, `{}`)
	checkPrivateFiles(t, n.DataDir)
	n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, n.key, "")
}

// checkPrivateFiles fails the test for every file below dir (regular files
// and sockets) with a group or other permission bit.
func checkPrivateFiles(t *testing.T, dir string) {
	t.Helper()
	var open []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) { // removed while walking
				return nil
			}
			return err
		}
		if d.IsDir() || d.Type()&os.ModeSymlink != 0 || filepath.Base(p) == "ca.pem" {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil // removed while walking
		}
		if m := fi.Mode().Perm(); m&0o077 != 0 {
			rel, _ := filepath.Rel(dir, p)
			open = append(open, fmt.Sprintf("%s %v", rel, fi.Mode()))
		}
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", dir, err)
	}
	if len(open) > 0 {
		t.Errorf("%d files of the data dir are open to other users:\n%s", len(open), strings.Join(open, "\n"))
	}
}

// readLink is the target of a symbolic link, "" when it cannot be read.
func readLink(p string) string {
	s, _ := os.Readlink(p)
	return s
}
