package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/guest/agent/agentclient"
	"github.com/agentenv/agentenv/internal/testutil/guestassets"
	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/vmm/qemu"
	"github.com/agentenv/agentenv/vmm/vmmtest"
)

// clockWindow is how long each clock rate is measured over.
const clockWindow = 20 * time.Second

// TestClockRateAfterHostChange: a TCG guest calibrated for a TSC 5 % slower
// than the host's (as one booted on another host and restored here) keeps
// time more than 1 % off with the /init E2B's SDKs send, which steps the
// clock only; the node's /init, which names this host's TSC, brings the
// rate within 1 % of the host's clock. Both rates are measured over a
// window against the host's clock.
func TestClockRateAfterHostChange(t *testing.T) {
	host := qemu.HostTSCkHz()
	if host == 0 {
		t.Skip("the host's TSC frequency is unknown (no \"cpu MHz\" in /proc/cpuinfo)")
	}
	a := guestassets.Get(t)
	d, err := qemu.New(context.Background(), qemu.Options{ProbeKernel: a.Kernel})
	if err != nil {
		t.Fatal(err)
	}
	if accel, reason := d.Accel(); accel != "tcg" {
		t.Skipf("QEMU runs under %s (%s): the guest's clock is kvm-clock, kept right by the host; this is TCG's case", accel, reason)
	}
	calib := host * 95 / 100
	vm, tn := bootVM(t, d, a, fmt.Sprintf("tsc_early_khz=%d", calib))
	if got := vm.Info().TSCkHz; got != host {
		t.Fatalf("machine reports host TSC %d kHz, want %d", got, host)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// What the guest's clock runs on, for the log: the kernel's command
	// line, its clock sources and what it said about its TSC and timers.
	kernel, errb, code, err := agentclient.RunWith(ctx, tn.AgentURL(), tn.HTTP, []agentclient.Option{agentclient.WithUser("root")},
		"sh", "-c", "cat /proc/cmdline /sys/devices/system/clocksource/clocksource0/*_clocksource; dmesg | grep -i -e tsc -e clocksource -e apic -e timer")
	if err != nil || code != 0 {
		t.Fatalf("guest kernel's clock: %v (exit %d): %s", err, code, errb)
	}
	t.Logf("host TSC %d kHz, guest calibrated at %d kHz; guest kernel:\n%s", host, calib, kernel)
	if !slices.Contains(strings.Fields(string(kernel)), fmt.Sprintf("tsc_early_khz=%d", calib)) {
		t.Fatalf("guest kernel not told tsc_early_khz=%d", calib)
	}

	postInit(ctx, t, tn, sandbox.InitRequest{Timestamp: time.Now().UTC()})
	before := guestRate(ctx, t, tn)
	if math.Abs(before-1) <= 0.01 {
		t.Fatalf("uncorrected guest clock runs at %.4f of the host's: the simulated host change did not take", before)
	}
	postInit(ctx, t, tn, sandbox.InitRequest{Timestamp: time.Now().UTC(), HostTSCkHz: vm.Info().TSCkHz})
	after := guestRate(ctx, t, tn)
	if math.Abs(after-1) > 0.01 {
		t.Fatalf("corrected guest clock runs at %.4f of the host's (uncorrected %.4f), want within 1 %%", after, before)
	}
	t.Logf("guest clock rate: %.4f uncorrected, %.4f corrected", before, after)
}

// guestRun runs a command in the guest and returns its output.
func guestRun(ctx context.Context, t *testing.T, tn *vmmtest.TestNet, cmd string, args ...string) string {
	t.Helper()
	out, errb, code, err := agentclient.Run(ctx, tn.AgentURL(), tn.HTTP, cmd, args...)
	if err != nil || code != 0 {
		t.Fatalf("guest %s %q: %v (exit %d): %s", cmd, args, err, code, errb)
	}
	return string(out)
}

// postInit sends req as the node does after a start.
func postInit(ctx context.Context, t *testing.T, tn *vmmtest.TestNet, req sandbox.InitRequest) {
	t.Helper()
	body, _ := json.Marshal(req)
	hr, _ := http.NewRequestWithContext(ctx, http.MethodPost, tn.AgentURL()+"/init", bytes.NewReader(body))
	hr.Header.Set("Content-Type", "application/json")
	resp, err := tn.HTTP.Do(hr)
	if err != nil {
		t.Fatalf("/init: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("/init: %s", resp.Status)
	}
}

// guestRate is how fast the guest's clock runs against the host's over
// clockWindow: the guest's time read at each end, set against the middle
// of the host's time around the read.
func guestRate(ctx context.Context, t *testing.T, tn *vmmtest.TestNet) float64 {
	t.Helper()
	g0, h0, e0 := guestClock(ctx, t, tn)
	time.Sleep(clockWindow)
	g1, h1, e1 := guestClock(ctx, t, tn)
	host := h1.Sub(h0).Seconds()
	rate := (g1 - g0) / host
	t.Logf("guest clock advanced %.3f s in %.3f s of the host's: rate %.4f (reads within ±%s, ±%.2f %%)",
		g1-g0, host, rate, max(e0, e1), (e0+e1).Seconds()/host*100)
	return rate
}

// guestClock reads the guest's wall clock (seconds) and the host time it
// corresponds to, taken as the middle of the request; err is half the
// request's time, the bound on that. Of three reads, the one with the
// shortest request is kept: the others' process start-ups blur it.
func guestClock(ctx context.Context, t *testing.T, tn *vmmtest.TestNet) (guest float64, host time.Time, err time.Duration) {
	t.Helper()
	err = time.Hour
	for range 3 {
		start := time.Now()
		out := guestRun(ctx, t, tn, "date", "+%s.%N")
		took := time.Since(start)
		g, perr := strconv.ParseFloat(strings.TrimSpace(out), 64)
		if perr != nil {
			t.Fatalf("guest date: %q: %v", out, perr)
		}
		if took/2 < err {
			guest, host, err = g, start.Add(took/2), took/2
		}
	}
	return guest, host, err
}
