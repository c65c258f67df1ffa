package e2e

import (
	"os/exec"
	"strings"
	"testing"
)

// TestSandboxIDNotInProcNetUnix: another local user (nobody, through
// setpriv) reading /proc/net/unix, every process's command line, control
// groups and mount table, and every folder under /sys/fs/cgroup sees no
// running sandbox's id: the QMP socket in the sandbox's run directory is
// bound under a /proc/self/fd name, QEMU's command line names descriptors,
// and its control group is named by a digest (sandbox.GroupName).
func TestSandboxIDNotInProcNetUnix(t *testing.T) {
	n := sharedNode(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Fatalf("setpriv (util-linux, installed on every Debian system) is missing: %v", err)
	}
	id := n.create(t, `{"templateID":"base","timeout":120}`)
	if got := n.sh(t, id, "echo up"); got != "up" {
		t.Fatalf("sandbox %s: %q", id, got)
	}
	// As nobody: the socket table, and each process's command line.
	script := `cat /proc/net/unix; for f in /proc/[0-9]*/cmdline; do tr '\0' ' ' < "$f" 2>/dev/null; echo; done
		cat /proc/[0-9]*/cgroup /proc/[0-9]*/mountinfo 2>/dev/null; find /sys/fs/cgroup 2>/dev/null; true`
	out, err := exec.Command(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", "--", "/bin/sh", "-c", script).CombinedOutput()
	if err != nil {
		t.Fatalf("read /proc as nobody: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "qemu-system") || !strings.Contains(string(out), "Inode") ||
		!strings.Contains(string(out), "/aenv/") {
		t.Fatalf("nobody's view of /proc lacks the VMM, the socket table or the VMMs' control groups:\n%.2000s", out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, id) {
			t.Fatalf("another local user reads sandbox %s's id in /proc: %s", id, line)
		}
	}
}
