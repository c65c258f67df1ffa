package cgroup

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func writeFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// A v1 (hybrid) host: each controller's groups go under the process's own
// group in that controller's hierarchy; one where the process sits outside
// its unit's group (not delegated) is left out.
func TestDelegatedV1(t *testing.T) {
	dir := t.TempDir()
	mi := writeFile(t, dir, "mountinfo", `61 54 0:30 / /cg/cpu rw - cgroup cgroup rw,cpu
62 54 0:31 / /cg/memory rw - cgroup cgroup rw,memory
67 54 0:35 / /cg/pids rw - cgroup cgroup rw,pids
80 62 0:31 /system.slice/aenvd.service /cg/memory/system.slice/aenvd.service rw - cgroup cgroup rw,memory
69 54 0:37 / /cg/unified rw - cgroup2 cgroup rw
`)
	self := writeFile(t, dir, "cgroup", `8:pids:/system.slice/aenvd.service
4:memory:/system.slice/aenvd.service
1:cpu:/
0::/system.slice/aenvd.service
`)
	h, err := Delegated(mi, self, "aenv/n1")
	if err != nil {
		t.Fatal(err)
	}
	if h.Dirs["cpu"] != "" || len(h.Undelegated) != 1 || h.Undelegated[0] != "cpu" {
		t.Errorf("cpu is not delegated: dir %q, undelegated %v", h.Dirs["cpu"], h.Undelegated)
	}
	want := map[string]string{
		"memory": "/cg/memory/system.slice/aenvd.service/aenv/n1",
		"pids":   "/cg/pids/system.slice/aenvd.service/aenv/n1",
	}
	for c, d := range want {
		if h.Dirs[c] != d || h.V2[c] {
			t.Errorf("%s: dir %s (v2 %v), want %s on v1", c, h.Dirs[c], h.V2[c], d)
		}
	}
}

// A v2 host: the groups go under the delegated group, also when the process
// already sits in the leaf (a restart).
func TestDelegatedV2(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "unified")
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, root, "cgroup.controllers", "cpuset cpu io memory pids\n")
	mi := writeFile(t, dir, "mountinfo", "69 54 0:37 / "+root+" rw - cgroup2 cgroup2 rw\n")
	for _, own := range []string{"/system.slice/aenvd.service", "/system.slice/aenvd.service/aenvd"} {
		self := writeFile(t, dir, "cgroup", "0::"+own+"\n")
		h, err := Delegated(mi, self, "aenv/n1")
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range controllers {
			if want := root + "/system.slice/aenvd.service/aenv/n1"; h.Dirs[c] != want || !h.V2[c] {
				t.Errorf("own group %s, %s: dir %s, want %s on v2", own, c, h.Dirs[c], want)
			}
		}
	}
	self := writeFile(t, dir, "cgroup", "4:memory:/x\n")
	if _, err := Delegated(mi, self, "aenv/n1"); err == nil {
		t.Error("no v2 group of the process: want an error")
	}
}

// EnterLeaf on a real cgroup v2 hierarchy: a process in the delegated group
// moves into its leaf.
func TestEnterLeaf(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("moving a process between control groups needs root; CI runs as root")
	}
	mounts, err := readMounts("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	root, ok := mounts["cgroup2"]
	if !ok {
		t.Skip("no cgroup v2 hierarchy is mounted")
	}
	dir := filepath.Join(root, fmt.Sprintf("aenv-test-leaf-%d", os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot make a group in %s: %v", root, err)
	}
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = os.Remove(filepath.Join(dir, LeafName))
		_ = os.Remove(dir)
	})
	pid := strconv.Itoa(cmd.Process.Pid)
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(pid), 0); err != nil {
		t.Fatalf("move %s into %s: %v", pid, dir, err)
	}
	h := &Hierarchy{Roots: map[string]string{"pids": dir}, Dirs: map[string]string{"pids": filepath.Join(dir, "aenv")},
		V2: map[string]bool{"pids": true}}
	if err := h.EnterLeaf(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, LeafName, "cgroup.procs"))
	if err != nil || strings.TrimSpace(string(b)) != pid {
		t.Fatalf("the leaf holds %q (%v), want %s", b, err, pid)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs")); strings.TrimSpace(string(b)) != "" {
		t.Fatalf("the delegated group still holds %q", b)
	}
}
