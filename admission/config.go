package admission

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/agentenv/agentenv/config"
)

// FromConfig turns the [admission] section into Limits for a node whose
// data directory is dataDir and whose host has hostMiB of memory (zero:
// unknown, then a zero max_committed_mib does not limit).
func FromConfig(c config.Admission, dataDir string, hostMiB int) Limits {
	l := Limits{MaxSandboxes: c.MaxSandboxes, MaxCommittedMiB: c.MaxCommittedMiB, MaxForkChildren: c.MaxForkChildren,
		DiskReserveBytes: int64(c.DiskReserveMiB) << 20, DataDir: dataDir}
	if l.MaxCommittedMiB == 0 && hostMiB > 0 && c.MemoryOvercommitPct > 0 {
		l.MaxCommittedMiB = max(hostMiB-c.HostReserveMiB, 0) * c.MemoryOvercommitPct / 100
		if l.MaxCommittedMiB == 0 {
			l.MaxCommittedMiB = 1 // a reserve above the host's memory admits nothing, not everything
		}
	}
	return l
}

// HostMemoryMiB is the host's memory (MemTotal of /proc/meminfo).
func HostMemoryMiB() (int, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("read host memory: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			kib, err := strconv.Atoi(fields[1])
			if err != nil {
				return 0, fmt.Errorf("read host memory: MemTotal %q: %w", fields[1], err)
			}
			return kib >> 10, nil
		}
	}
	return 0, fmt.Errorf("read host memory: no MemTotal in /proc/meminfo")
}
