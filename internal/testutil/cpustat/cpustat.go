// Package cpustat reads how much CPU time the whole machine spent busy, so
// a benchmark can tell work that waits from work the CPUs serialise.
package cpustat

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of /proc/stat's counters (USER_HZ, 100 on Linux).
const userHZ = 100

// Busy is the machine's CPU time spent so far in user, nice, system, irq
// and softirq, all cores summed (/proc/stat's first line; guest time is
// counted in user already, and steal is another machine's).
func Busy() (time.Duration, error) {
	text, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, fmt.Errorf("cpu busy time: %w", err)
	}
	return parse(string(text))
}

func parse(text string) (time.Duration, error) {
	line, _, _ := strings.Cut(text, "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0, fmt.Errorf("cpu busy time: unexpected /proc/stat line %q", line)
	}
	var ticks int64
	for i, s := range f[1:] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("cpu busy time: /proc/stat field %d %q: %w", i+1, s, err)
		}
		if i <= 2 || i == 5 || i == 6 { // user nice system, irq softirq
			ticks += v
		}
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}
