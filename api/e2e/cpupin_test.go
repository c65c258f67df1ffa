package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/agentenv/agentenv/internal/cpulist"
	"github.com/agentenv/agentenv/internal/vmmproc"
)

type cpusJSON struct {
	Pin     string `json:"pin"`
	VCPUs   int    `json:"vcpus"`
	Threads *[]struct {
		VCPU     int    `json:"vcpu"`
		ThreadID int    `json:"threadID"`
		CPUs     string `json:"cpus"`
	} `json:"threads"`
}

// TestPinCPUs pins a running sandbox's vCPUs to one host CPU and reads
// each vCPU thread's Cpus_allowed_list from /proc (threads found by their
// QEMU names, not through the API): pinned; a bad list is 400 naming the
// part and changes nothing; a paused sandbox keeps the list and its resume
// pins the new VMM; a SIGKILL restart of aenvd adopts the VMM with the list
// still recorded and in force; an empty list unpins.
func TestPinCPUs(t *testing.T) {
	n := sharedNode(t)
	avail := pinnableCPUs(t)
	cpus := avail.CPUs()
	one := strconv.Itoa(cpus[len(cpus)-1])
	id := n.create(t, `{"templateID":"base","timeout":300}`)
	pin := func(body string, want int) cpusJSON {
		t.Helper()
		var c cpusJSON
		b := n.expect(t, want, "PUT", "/sandboxes/"+id+"/cpus", n.key, body)
		if want == http.StatusOK {
			if err := json.Unmarshal(b, &c); err != nil {
				t.Fatalf("pin %s: %s %v", body, b, err)
			}
		}
		return c
	}
	get := func() cpusJSON {
		t.Helper()
		var c cpusJSON
		if err := json.Unmarshal(n.expect(t, http.StatusOK, "GET", "/sandboxes/"+id+"/cpus", n.key, ""), &c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	// check: the threads /proc names vCPUs are pinned to want, and are the
	// ones GET reports, each with that affinity.
	check := func(want string) int {
		t.Helper()
		pid, tids := vcpusAllowed(t, id, want)
		c := get()
		if c.Threads == nil || len(*c.Threads) != c.VCPUs {
			t.Fatalf("GET while running: %+v, want one thread per vCPU", c)
		}
		reported := map[int]bool{}
		for _, th := range *c.Threads {
			reported[th.ThreadID] = true
			if th.CPUs != want {
				t.Errorf("GET reports vCPU %d on %s, want %s", th.VCPU, th.CPUs, want)
			}
		}
		if !maps.Equal(reported, tids) {
			t.Fatalf("GET reports vCPU threads %v, the VMM's named vCPU threads are %v", reported, tids)
		}
		return pid
	}

	if c := get(); c.Pin != "" || c.VCPUs < 1 || c.Threads == nil || len(*c.Threads) != c.VCPUs {
		t.Fatalf("before pinning: %+v", c)
	}
	check(avail.String())
	c := pin(`{"pin":"`+one+`"}`, http.StatusOK)
	if c.Pin != one || c.Threads == nil || len(*c.Threads) == 0 || (*c.Threads)[0].CPUs != one {
		t.Fatalf("pinned to %s: answer %+v", one, c)
	}
	pid1 := check(one)

	for body, says := range map[string]string{
		`{"pin":"0,0"}`:   `part \"0\"`,
		`{"pin":"1023"}`:  `cpu 1023 is not available`,
		`{"pin":"0-1 "}`:  `part \"0-1 \"`,
		`{"cpus":"0-1"}`:  `pin is required`,
		`{"pin":"0--1"}`:  `part \"0--1\"`,
		`{"pin":"4096"}`:  `out of range`,
		`{"pin":"1,1-1"}`: `part \"1-1\"`,
	} {
		b := n.expect(t, http.StatusBadRequest, "PUT", "/sandboxes/"+id+"/cpus", n.key, body)
		if !strings.Contains(string(b), says) {
			t.Errorf("PUT %s: %s, want it to say %s", body, b, says)
		}
	}
	if c := get(); c.Pin != one {
		t.Fatalf("a refused list changed the pin: %+v", c)
	}
	check(one)

	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, "")
	if c := get(); c.Pin != one || c.Threads != nil {
		t.Fatalf("paused: %+v, want the pin kept and no threads", c)
	}
	n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", n.key, `{"timeout":300}`)
	pid2 := check(one)
	if pid2 == pid1 {
		t.Fatalf("the resumed sandbox runs in the VMM of before (%d)", pid1)
	}

	n.restart(t, syscall.SIGKILL)
	if c := get(); c.Pin != one {
		t.Fatalf("after the restart the pin is %q, want %s", c.Pin, one)
	}
	if pid3 := check(one); pid3 != pid2 {
		t.Fatalf("after the restart the sandbox runs in VMM %d, not the adopted %d", pid3, pid2)
	}

	if c := pin(`{"pin":""}`, http.StatusOK); c.Pin != "" {
		t.Fatalf("unpinned: %+v", c)
	}
	check(avail.String())
}

// vcpusAllowed checks that every vCPU thread of the sandbox's VMM (named
// "CPU n/TCG", "CPU n/KVM" or, single-threaded, "ALL CPUs/TCG") may run on
// exactly the CPUs of want, and returns the VMM's pid and those threads.
func vcpusAllowed(t *testing.T, id, want string) (int, map[int]bool) {
	t.Helper()
	var pid int
	for _, p := range processesMentioning(id) {
		if vmmproc.IsVMM(filepath.Join("/proc", p)) {
			if pid != 0 {
				t.Fatalf("sandbox %s has two VMM processes: %d and %s", id, pid, p)
			}
			pid, _ = strconv.Atoi(p)
		}
	}
	if pid == 0 {
		t.Fatalf("no VMM process of sandbox %s", id)
	}
	tasks, err := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*"))
	if err != nil {
		t.Fatal(err)
	}
	found := map[int]bool{}
	for _, task := range tasks {
		comm, err := os.ReadFile(filepath.Join(task, "comm"))
		if err != nil {
			continue // the thread ended
		}
		name := strings.TrimSpace(string(comm))
		if !strings.HasPrefix(name, "CPU ") && !strings.HasPrefix(name, "ALL CPUs") {
			continue
		}
		tid, _ := strconv.Atoi(filepath.Base(task))
		found[tid] = true
		status, err := os.ReadFile(filepath.Join(task, "status"))
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		for _, line := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
				got = strings.TrimSpace(v)
			}
		}
		if got != want {
			t.Errorf("VMM %d thread %s (%s): Cpus_allowed_list %q, want %q", pid, filepath.Base(task), name, got, want)
		}
	}
	if len(found) == 0 {
		t.Fatalf("VMM %d of sandbox %s has no vCPU thread", pid, id)
	}
	return pid, found
}

// crashCPUPin: a crash after the vCPU threads took a new pin list but
// before the record did leaves the record's (old, empty) list; the
// adopting restart sets the threads to it, so record and threads agree.
func (n *node) crashCPUPin(t *testing.T, point string) {
	avail := pinnableCPUs(t)
	cpus := avail.CPUs()
	id := n.create(t, `{"templateID":"base","timeout":300}`)
	n.crashAt(t, point, func() {
		_, _, _, _ = n.Call("PUT", "/sandboxes/"+id+"/cpus", n.key, fmt.Sprintf(`{"pin":"%d"}`, cpus[len(cpus)-1]))
	})
	var c cpusJSON
	if err := json.Unmarshal(n.expect(t, http.StatusOK, "GET", "/sandboxes/"+id+"/cpus", n.key, ""), &c); err != nil {
		t.Fatal(err)
	}
	if c.Pin != "" {
		t.Fatalf("crashed at %s: the record says pin %q, want the old empty list", point, c.Pin)
	}
	vcpusAllowed(t, id, avail.String())
	if got := n.sh(t, id, "echo alive"); got != "alive" {
		t.Fatalf("crashed at %s: the adopted sandbox answers %q", point, got)
	}
}

// pinnableCPUs returns the CPUs aenvd may pin to, skipping the test where
// there is only one (pinning to it would change nothing to check).
func pinnableCPUs(t *testing.T) cpulist.List {
	t.Helper()
	avail, err := cpulist.Available()
	if err != nil {
		t.Fatal(err)
	}
	cpus := avail.CPUs()
	if len(cpus) < 2 {
		t.Skipf("pinning to one CPU changes nothing on a host with available CPUs %s; needs two", avail)
	}
	return avail
}
