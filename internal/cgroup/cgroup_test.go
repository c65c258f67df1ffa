package cgroup

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func testHierarchy(t *testing.T) *Hierarchy {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("creating control groups needs root; CI runs as root")
	}
	h, err := Detect(fmt.Sprintf("aenv-test/%d", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, d := range h.Dirs {
			_ = os.Remove(d)
			_ = os.Remove(filepath.Dir(d))
		}
	})
	return h
}

func readLimit(t *testing.T, g *Group, c, v1, v2 string) string {
	t.Helper()
	file := v1
	if g.h.V2[c] {
		file = v2
	}
	b, err := os.ReadFile(filepath.Join(g.dir(c), file))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func TestLimitsAndMembership(t *testing.T) {
	h := testHierarchy(t)
	g, err := h.Create("sbx1", Limits{CPUs: 1.5, MemoryBytes: 256 << 20, Pids: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Remove()
	if got := readLimit(t, g, "memory", "memory.limit_in_bytes", "memory.max"); got != fmt.Sprint(256<<20) {
		t.Errorf("memory limit %s", got)
	}
	if got := readLimit(t, g, "cpu", "cpu.cfs_quota_us", "cpu.max"); !strings.HasPrefix(got, "150000") {
		t.Errorf("cpu quota %s", got)
	}
	if got := readLimit(t, g, "pids", "pids.max", "pids.max"); got != "3" {
		t.Errorf("pids limit %s", got)
	}

	// A shell in the group cannot start more processes than the limit.
	cmd := exec.Command("/bin/sh", "-c", "read x; for i in 1 2 3 4 5; do sleep 30 & done; wait")
	stdin, _ := cmd.StdinPipe()
	var out syncBuffer
	cmd.Stderr = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if err := g.Add(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", cmd.Process.Pid))
	if !strings.Contains(string(b), "/sbx1") {
		t.Fatalf("process not in the group: %s", b)
	}
	stdin.Write([]byte("go\n"))
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), "fork") && !strings.Contains(out.String(), "Resource temporarily unavailable") {
		if time.Now().After(deadline) {
			t.Fatalf("the shell started more than 3 processes; stderr %q", out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	procs, err := g.Procs()
	if err != nil || len(procs) > 3 || len(procs) == 0 {
		t.Fatalf("processes in the group: %v %v", procs, err)
	}
	// Remove kills what still runs and removes the group.
	if err := g.Remove(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Remove left the group's process running")
	}
	if names, _ := h.List(); len(names) != 0 {
		t.Fatalf("groups left: %v", names)
	}
	if err := g.Remove(); err != nil {
		t.Fatalf("second Remove: %v", err)
	}
}

func TestBadParents(t *testing.T) {
	for _, p := range []string{"", "/abs", "../up", "."} {
		if _, err := Detect(p); err == nil {
			t.Errorf("parent %q accepted", p)
		}
	}
}

func TestBadNames(t *testing.T) {
	h := &Hierarchy{Dirs: map[string]string{"cpu": "/x", "memory": "/x", "pids": "/x"}}
	for _, n := range []string{"", ".", "..", "a/b", "a\x00"} {
		if _, err := h.Open(n); err == nil {
			t.Errorf("name %q accepted", n)
		}
	}
}

func TestReadMounts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "mountinfo")
	os.WriteFile(path, []byte(`30 24 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
31 30 0:27 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw
35 30 0:31 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
36 30 0:32 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
garbage line
`), 0o644)
	m, err := readMounts(path)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"cgroup2": "/sys/fs/cgroup/unified", "cgroup:memory": "/sys/fs/cgroup/memory", "cgroup:cpu": "/sys/fs/cgroup/cpu,cpuacct"}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s = %q, want %q", k, m[k], v)
		}
	}
	if _, ok := m["cgroup:pids"]; ok {
		t.Error("pids found where none is mounted")
	}
}

// syncBuffer is a buffer the command's stderr copier writes while the test
// reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
