package deploy

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSystemdBoot boots a Debian 12 tree under systemd-nspawn with systemd
// as PID 1, installs the node with scripts/install.sh inside and expects
// aenv-storaged.service and aenvd.service active and /health answering, with
// the default sandbox.cgroups = true: aenvd makes its VMMs' groups under the
// group systemd delegates to aenvd.service (Delegate=). It then creates a
// sandbox (a QEMU VM under TCG inside the container), checks its VMM's
// group, runs a command in it with the aenv CLI, restarts aenvd.service and
// runs one in the adopted sandbox (deploy/nspawn/boot.sh and sandbox.sh).
// It boots a VM: run it under the shared VM lock like the other VM tests.
// Before the unit delegated a group, aenvd refused at start: "sandbox.cgroups
// = true: cgroup: the cpu hierarchy at /sys/fs/cgroup/cpu is mounted
// read-only"; before it allowed mount namespaces it failed with
// "aenv-vmm-jail: unshare the mount namespace: operation not permitted".
func TestSystemdBoot(t *testing.T) {
	repo, bin := nspawnPrereqs(t, "boots a Debian tree under systemd-nspawn")
	cmd := exec.Command(filepath.Join(repo, "deploy/nspawn/boot.sh"), bin)
	out, err := cmd.CombinedOutput()
	t.Logf("boot.sh:\n%s", out)
	if err != nil || !strings.Contains(string(out), "\nPASS") {
		t.Fatalf("the node did not come up under systemd: %v", err)
	}
}
