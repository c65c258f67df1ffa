package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

type memoryJSON struct {
	CeilingMB   int   `json:"ceilingMB"`
	RequestedMB *int  `json:"requestedMB"`
	TargetMB    int   `json:"targetMB"`
	ActualMB    *int  `json:"actualMB"`
	Complete    *bool `json:"complete"`
}

// TestResizeMemory resizes one sandbox's memory (the test node's base
// template has 256 MiB) through the API: down to 128 MiB the guest's
// MemTotal drops by exactly 128 MiB and the node's allocated memory by 128
// MiB; sizes out of range are 400 and change nothing. A process holding
// 120 MiB makes a resize to 128 MiB partial (complete false, the guest
// keeping what the process holds and some available memory: the target is
// set where it can go); the process is not OOM-killed, a resize back up
// completes and the process runs on with no OOM kill in the guest's log. Once the process ends the guest
// reaches 128 MiB; a fork's child has that size too; a pause and a resume
// from memory keep it (the balloon's state travels with the VM), and so
// does a filesystem-only pause, whose resume boots a new VM that is given
// the recorded target.
func TestResizeMemory(t *testing.T) {
	n := sharedNode(t)
	id := n.create(t, `{"templateID":"base","timeout":600}`)
	mem := n.memory(t, id)
	if mem.CeilingMB != 256 || mem.TargetMB != 256 || mem.ActualMB == nil || *mem.ActualMB != 256 {
		t.Fatalf("a new base sandbox's memory: %+v, want ceiling, target and guest at 256 MiB", mem)
	}
	total0, alloc0 := n.memTotalKiB(t, id), n.allocatedMB(t)

	n.resize(t, id, 128, true)
	if drop := total0 - n.memTotalKiB(t, id); drop != 128<<10 {
		t.Fatalf("MemTotal dropped by %d KiB after a resize to 128 MiB, want %d", drop, 128<<10)
	}
	if alloc := n.allocatedMB(t); alloc != alloc0-128 {
		t.Fatalf("/nodes allocatedMemoryMB %d after the resize, want %d (%d less 128)", alloc, alloc0-128, alloc0)
	}
	for body, says := range map[string]string{
		`{"memoryMB":127}`:  "below the minimum of 128 MiB",
		`{"memoryMB":257}`:  "outside 128 to 256 MiB",
		`{"memoryMB":4096}`: "outside 128 to 256 MiB",
	} {
		if b := n.expect(t, http.StatusBadRequest, "PATCH", "/sandboxes/"+id+"/memory", n.key, body); !strings.Contains(string(b), says) {
			t.Errorf("PATCH %s: %s, want it to say %q", body, b, says)
		}
	}
	if m := n.memory(t, id); m.TargetMB != 128 {
		t.Fatalf("a refused resize changed the target: %+v", m)
	}

	n.resize(t, id, 256, true)
	if total := n.memTotalKiB(t, id); total != total0 {
		t.Fatalf("MemTotal %d KiB after growing back to 256 MiB, want %d", total, total0)
	}
	// 120 MiB written (not only reserved) by a process that keeps it.
	n.sh(t, id, `setsid nohup python3 -c 'import time; b = b"\x01" * (120 << 20); open("/tmp/held", "w").write("y"); time.sleep(100000)' >/dev/null 2>&1 < /dev/null & echo $! > /tmp/hog.pid
		for i in $(seq 600); do [ -e /tmp/held ] && break; sleep 0.1; done; test -e /tmp/held`)
	part := n.resize(t, id, 128, false)
	if *part.ActualMB < 120 || part.TargetMB < *part.ActualMB {
		t.Fatalf("partial resize: %+v with a process holding 120 MiB, want the guest at 120 MiB at least and the target at or above it", part)
	}
	if m := n.memory(t, id); m.TargetMB != part.TargetMB {
		t.Fatalf("after the partial resize GET says target %d MiB, the answer %d", m.TargetMB, part.TargetMB)
	}
	n.resize(t, id, 256, true)
	if got := n.sh(t, id, `kill -0 $(cat /tmp/hog.pid) && echo alive; dmesg | grep -ci -e "out of memory" -e oom-kill || true`); got != "alive\n0" {
		t.Fatalf("the process holding 120 MiB after the partial resize and the growth: %q, want alive and no OOM kill", got)
	}
	// Gone, or a zombie (its memory freed) if no one reaps it.
	n.sh(t, id, `pid=$(cat /tmp/hog.pid); kill $pid
		while [ -e /proc/$pid ] && ! grep -q "^State:.*Z" /proc/$pid/status 2>/dev/null; do sleep 0.1; done`)
	n.resize(t, id, 128, true)
	small := n.memTotalKiB(t, id)

	// A fork's child restores the parent's state, balloon and all, and
	// its record carries the target.
	kid := n.forkChildren(t, id, 1)[0]
	if m := n.memory(t, kid); m.CeilingMB != 256 || m.TargetMB != 128 || m.ActualMB == nil || *m.ActualMB != 128 {
		t.Fatalf("fork child: %+v, want ceiling 256, target and guest at 128 MiB", m)
	}
	if total := n.memTotalKiB(t, kid); total != small {
		t.Fatalf("fork child's MemTotal %d KiB, want its parent's %d", total, small)
	}
	n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+kid, n.key, "")

	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, "")
	if m := n.memory(t, id); m.TargetMB != 128 || m.ActualMB != nil {
		t.Fatalf("paused: %+v, want target 128 and no guest memory", m)
	}
	n.expect(t, http.StatusConflict, "PATCH", "/sandboxes/"+id+"/memory", n.key, `{"memoryMB":256}`)
	n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", n.key, `{"timeout":600}`)
	if m := n.memory(t, id); m.TargetMB != 128 || m.ActualMB == nil || *m.ActualMB != 128 {
		t.Fatalf("resumed: %+v, want target and guest at 128 MiB", m)
	}
	if total := n.memTotalKiB(t, id); total != small {
		t.Fatalf("MemTotal %d KiB after the resume, want the resized %d", total, small)
	}

	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, `{"memory":false}`)
	n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", n.key, `{"timeout":600}`)
	n.waitMemory(t, id, 128)
	if total := n.memTotalKiB(t, id); total != small {
		t.Fatalf("MemTotal %d KiB after a cold resume, want the resized %d", total, small)
	}
	n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, n.key, "")
}

// memory reads GET /sandboxes/{id}/memory.
func (n *node) memory(t *testing.T, id string) memoryJSON {
	t.Helper()
	var m memoryJSON
	if err := json.Unmarshal(n.expect(t, http.StatusOK, "GET", "/sandboxes/"+id+"/memory", n.key, ""), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// resize asks for mib and checks the answer: the size asked for, and
// either the guest and the target at it (complete) or the guest above it
// (not).
func (n *node) resize(t *testing.T, id string, mib int, complete bool) memoryJSON {
	t.Helper()
	var m memoryJSON
	b := n.expect(t, http.StatusOK, "PATCH", "/sandboxes/"+id+"/memory", n.key, fmt.Sprintf(`{"memoryMB":%d}`, mib))
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	ok := m.RequestedMB != nil && *m.RequestedMB == mib && m.ActualMB != nil && m.Complete != nil && *m.Complete == complete
	if ok && complete {
		ok = *m.ActualMB == mib && m.TargetMB == mib
	} else if ok {
		ok = *m.ActualMB > mib
	}
	if !ok {
		t.Fatalf("resize to %d MiB: %s, want complete %v\n%s", mib, b, complete, n.diagnose(id))
	}
	return m
}

// waitMemory waits for a freshly booted guest's balloon driver to reach
// mib (it starts once the guest loads it; no time is asserted, the bound
// only ends a hung test).
func (n *node) waitMemory(t *testing.T, id string, mib int) {
	t.Helper()
	var m memoryJSON
	for end := time.Now().Add(3 * time.Minute); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if m = n.memory(t, id); m.ActualMB != nil && *m.ActualMB == mib {
			return
		}
	}
	t.Fatalf("the guest never reached %d MiB: %+v\n%s", mib, m, n.diagnose(id))
}

// memTotalKiB is the guest's MemTotal.
func (n *node) memTotalKiB(t *testing.T, id string) int {
	t.Helper()
	out := n.sh(t, id, `awk '/^MemTotal:/ {print $2}' /proc/meminfo`)
	kib, err := strconv.Atoi(out)
	if err != nil {
		t.Fatalf("MemTotal: %q: %v", out, err)
	}
	return kib
}

// allocatedMB is /nodes' allocatedMemoryMB.
func (n *node) allocatedMB(t *testing.T) int {
	t.Helper()
	var nodes []struct {
		AllocatedMemoryMB int `json:"allocatedMemoryMB"`
	}
	if err := json.Unmarshal(n.expect(t, http.StatusOK, "GET", "/nodes", n.key, ""), &nodes); err != nil || len(nodes) != 1 {
		t.Fatalf("/nodes: %+v %v", nodes, err)
	}
	return nodes[0].AllocatedMemoryMB
}

// crashResize: a crash after the VMM took a new memory target but before
// the record did leaves the record's (the full ceiling); the adopting
// restart gives the VMM that target again, so the guest grows back to it.
func (n *node) crashResize(t *testing.T, point string) {
	id := n.create(t, `{"templateID":"base","timeout":300}`)
	ceiling := n.memory(t, id).CeilingMB
	n.crashAt(t, point, func() {
		_, _, _, _ = n.Call("PATCH", "/sandboxes/"+id+"/memory", n.key, `{"memoryMB":128}`)
	})
	if m := n.memory(t, id); m.TargetMB != ceiling {
		t.Fatalf("crashed at %s: the record says target %d MiB, want the old %d", point, m.TargetMB, ceiling)
	}
	n.waitMemory(t, id, ceiling)
	if got := n.sh(t, id, "echo alive"); got != "alive" {
		t.Fatalf("crashed at %s: the adopted sandbox answers %q", point, got)
	}
}
