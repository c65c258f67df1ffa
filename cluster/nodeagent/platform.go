package nodeagent

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Platform is what a snapshot taken on this node needs of the node that
// restores it: the scheduler places resumes by it (cluster/scheduler
// restore.go).
type Platform struct {
	// Accel is the VMM's accelerator (kvm, tcg).
	Accel string
	// CPUModel and CPUFlags are the host CPU's model name and flags.
	CPUModel string
	CPUFlags []string
	// TSCkHz is the host TSC frequency (0: unknown).
	TSCkHz int64
}

// HostCPU reads the host CPU's model, flags and clock from /proc/cpuinfo
// (the first processor's; the TSC is taken from its "cpu MHz", the figure
// a TCG guest's tsc_early_khz is set from).
func HostCPU() (Platform, error) {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return Platform{}, fmt.Errorf("read host CPU: %w", err)
	}
	defer f.Close()
	return parseCPUInfo(f)
}

func parseCPUInfo(r io.Reader) (Platform, error) {
	var p Platform
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimSpace(line) == "" && p.CPUModel != "" {
			break // the first processor's block is enough
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch strings.TrimSpace(k) {
		case "model name":
			p.CPUModel = v
		case "flags":
			p.CPUFlags = strings.Fields(v)
		case "cpu MHz":
			if mhz, err := strconv.ParseFloat(v, 64); err == nil && mhz > 0 {
				p.TSCkHz = int64(mhz * 1000)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return Platform{}, fmt.Errorf("read host CPU: %w", err)
	}
	return p, nil
}
