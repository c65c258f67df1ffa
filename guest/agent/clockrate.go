package agent

import (
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The guest clock's rate after a restore on another host.
//
// Under QEMU's TCG the guest's TSC is the host's TSC, and the guest kernel
// takes its TSC frequency from tsc_early_khz on its command line (the host
// that booted it). Restored on a host whose TSC runs at another rate, the
// clock runs at hostKHz/calibKHz of real time. The node sends its TSC
// frequency in /init (hostTscKhz); the agent then sets the kernel's tick
// length (adjtimex ADJ_TICK), which scales how much time every tick's worth
// of TSC cycles adds, so that the clock advances at real rate again.

// adjTick is ADJ_TICK of <linux/timex.h> (x/sys does not name it).
const adjTick = 0x4000

// nominalTick is the kernel's tick length in µs: 1e6/USER_HZ, USER_HZ being
// 100 on every architecture the guest runs on.
const nominalTick = 10000

// Bounds the kernel accepts for the tick: ±10 % of nominal.
const (
	minTick = nominalTick * 9 / 10
	maxTick = nominalTick * 11 / 10
)

// tickFor is the tick length (µs) that makes a clock calibrated for a TSC
// of calibKHz advance at real rate on a TSC of hostKHz: the clock runs
// hostKHz/calibKHz too fast, and the time a tick adds is proportional to
// the tick length, so the tick is scaled by calibKHz/hostKHz. clamped says
// the ratio was beyond what the kernel accepts and the nearest bound was
// taken.
func tickFor(calibKHz, hostKHz int64) (tick int64, clamped bool) {
	if calibKHz <= 0 || hostKHz <= 0 {
		return nominalTick, false
	}
	tick = int64(math.Round(nominalTick * float64(calibKHz) / float64(hostKHz)))
	switch {
	case tick < minTick:
		return minTick, true
	case tick > maxTick:
		return maxTick, true
	}
	return tick, false
}

// calibratedKHz is the TSC frequency the kernel was told on its command
// line (tsc_early_khz), 0 when it was not told (it calibrated the TSC
// itself, against a timer that follows real time).
func calibratedKHz(cmdline string) int64 {
	for _, f := range strings.Fields(cmdline) {
		if v, ok := strings.CutPrefix(f, "tsc_early_khz="); ok {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > 0 {
				return n
			}
		}
	}
	return 0
}

// Where the kernel shows its command line and its clock source.
const (
	procCmdline        = "/proc/cmdline"
	currentClocksource = "/sys/devices/system/clocksource/clocksource0/current_clocksource"
)

// correctClockRate sets the tick length for a host TSC of hostKHz, whatever
// the clock source: a kernel that dropped its TSC clock source still times
// its ticks from the TSC frequency it was told, and its clock is off by the
// same ratio (measured, docs/architecture.md). It does nothing when the
// kernel was not told its TSC frequency. A ratio of about 1 sets the
// nominal tick back (a VM that moved back to a host like the one that
// booted it).
func (a *Agent) correctClockRate(hostKHz int64) error {
	cmdline, err := os.ReadFile(procCmdline)
	if err != nil {
		return fmt.Errorf("read kernel command line %s: %w", procCmdline, err)
	}
	calib := calibratedKHz(string(cmdline))
	if calib == 0 {
		a.log.Debug("init: clock rate left alone: no tsc_early_khz")
		return nil
	}
	tick, clamped := tickFor(calib, hostKHz)
	if clamped {
		a.log.Warn("init: host TSC too far from the calibration; clock rate corrected only in part",
			"calibrated_khz", calib, "host_khz", hostKHz, "tick", tick)
	}
	tx := unix.Timex{Modes: adjTick, Tick: tick}
	if _, err := unix.Adjtimex(&tx); err != nil {
		return fmt.Errorf("adjtimex tick %d: %w", tick, err)
	}
	src, _ := os.ReadFile(currentClocksource) // for the log only
	a.log.Info("init: clock rate set", "clocksource", strings.TrimSpace(string(src)),
		"calibrated_khz", calib, "host_khz", hostKHz, "tick", tick)
	return nil
}
