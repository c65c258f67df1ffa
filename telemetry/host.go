// Package telemetry is what the node reports about itself and its
// sandboxes: the host's load, memory and disk (the /nodes snapshot), a
// running guest's metrics and agent logs (asked of its agent), and the
// Prometheus metrics of the sandbox lifecycle's operations and stages.
package telemetry

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Host is one sample of the node's host: CPUs, load, memory and the data
// directory's filesystem.
type Host struct {
	CPUCount                  int
	LoadAverage1m             float64
	MemTotalMiB, MemUsedMiB   int64
	DiskTotalMiB, DiskUsedMiB int64
}

// SampleHost reads /proc and the filesystem holding dataDir; what cannot
// be read stays zero.
func SampleHost(dataDir string) Host {
	h := Host{CPUCount: runtime.NumCPU()}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			h.LoadAverage1m, _ = strconv.ParseFloat(f[0], 64)
		}
	}
	if total, avail, err := MemInfo(); err == nil {
		h.MemTotalMiB, h.MemUsedMiB = total>>10, (total-avail)>>10
	}
	var fs unix.Statfs_t
	if unix.Statfs(dataDir, &fs) == nil {
		bs := int64(fs.Bsize)
		h.DiskTotalMiB = int64(fs.Blocks) * bs >> 20
		h.DiskUsedMiB = int64(fs.Blocks-fs.Bfree) * bs >> 20
	}
	return h
}

// MemInfo returns MemTotal and MemAvailable of /proc/meminfo in KiB.
func MemInfo() (total, avail int64, err error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, 0, fmt.Errorf("read meminfo: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(fields[1], 10, 64)
		switch fields[0] {
		case "MemTotal:":
			total = v
		case "MemAvailable:":
			avail = v
		}
	}
	if err := sc.Err(); err != nil {
		return 0, 0, fmt.Errorf("read meminfo: %w", err)
	}
	return total, avail, nil
}

// MappedImages counts the distinct files among the memory files running
// VMs map (by device and inode; one per snapshot when shared) and the VMs
// that map one.
func MappedImages(files []string) (images, vms int) {
	seen := map[[2]uint64]bool{}
	for _, file := range files {
		var st unix.Stat_t
		if file == "" || unix.Stat(file, &st) != nil {
			continue
		}
		vms++
		seen[[2]uint64{st.Dev, st.Ino}] = true
	}
	return len(seen), vms
}
