package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/api/wire"
	"github.com/agentenv/agentenv/vmm/qemu"
)

// TestClockRateSetAfterResume: a resume's /init names this host's TSC
// under TCG, and the guest's agent sets its clock's tick for it: the
// nominal 10000 µs here, the template having been booted on this very host
// (a host with another TSC gets another tick: guest/agent/e2e
// TestClockRateAfterHostChange measures that). Under KVM nothing is sent
// and nothing set.
func TestClockRateSetAfterResume(t *testing.T) {
	n := sharedNode(t)
	id := n.create(t, `{"templateID":"base","timeout":300}`)
	accel := accelOf(t, qemuOf(t, id))
	before := clockRateEntries(t, n, id)
	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, "")
	n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", n.key, `{"timeout":300}`)
	after := clockRateEntries(t, n, id)
	if accel == "kvm" {
		if len(after) != 0 {
			t.Fatalf("under KVM the guest's clock rate was set: %v", after)
		}
		return
	}
	if len(after) != len(before)+1 {
		t.Fatalf("clock rate set %d times before the pause and %d after the resume, want one more", len(before), len(after))
	}
	t.Logf("clock rate set after the create and the resume: %v", after)
	want := strconv.Itoa(qemu.HostTSCkHz())
	for _, e := range after { // the create's (a restore of the template) and the resume's
		if e["host_khz"] != want || e["tick"] != "10000" {
			t.Fatalf("clock rate set: %v, want host_khz=%s tick=10000", e, want)
		}
	}
}

// accelOf is the accelerator of the QEMU process pid ("tcg", "kvm").
func accelOf(t *testing.T, pid string) string {
	t.Helper()
	raw, _ := os.ReadFile("/proc/" + pid + "/cmdline")
	args := strings.Split(string(raw), "\x00")
	for i, a := range args {
		if a == "-accel" && i+1 < len(args) {
			if accel, _, _ := strings.Cut(args[i+1], ","); accel == "tcg" || accel == "kvm" {
				return accel
			}
		}
	}
	t.Fatalf("QEMU %s names no accelerator: %q", pid, args)
	return ""
}

// clockRateEntries are the fields of the agent's "clock rate set" lines in
// the sandbox's logs (all of them: the one a restore logs carries the
// snapshot's time, the clock being stepped after it).
func clockRateEntries(t *testing.T, n *node, id string) []map[string]string {
	t.Helper()
	var logs wire.SandboxLogs
	if err := json.Unmarshal(n.expect(t, http.StatusOK, "GET", "/sandboxes/"+id+"/logs?limit=10000", n.key, ""), &logs); err != nil {
		t.Fatalf("logs of %s: %v", id, err)
	}
	var out []map[string]string
	for _, e := range logs.LogEntries {
		if e.Message == "init: clock rate set" {
			out = append(out, e.Fields)
		}
	}
	return out
}
