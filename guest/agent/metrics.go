package agent

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Metrics is the body of GET /metrics (field names from the envd API).
type Metrics struct {
	TS         int64   `json:"ts"`
	CPUCount   int     `json:"cpu_count"`
	CPUUsedPct float64 `json:"cpu_used_pct"`
	MemTotal   uint64  `json:"mem_total"`
	MemUsed    uint64  `json:"mem_used"`
	MemTotalMB uint64  `json:"mem_total_mib"`
	MemUsedMB  uint64  `json:"mem_used_mib"`
	DiskUsed   uint64  `json:"disk_used"`
	DiskTotal  uint64  `json:"disk_total"`
}

// cpuSampler remembers the previous /proc/stat reading so that each call
// reports the usage since the last one.
type cpuSampler struct {
	mu          sync.Mutex
	busy, total uint64
}

var cpuState cpuSampler

func (a *Agent) handleMetrics(w http.ResponseWriter, r *http.Request) {
	m, err := ReadMetrics()
	if err != nil {
		WriteError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(m)
}

// ReadMetrics samples /proc and the root filesystem.
func ReadMetrics() (*Metrics, error) {
	m := &Metrics{TS: time.Now().Unix(), CPUCount: runtime.NumCPU()}
	pct, err := cpuState.sample()
	if err != nil {
		return nil, err
	}
	m.CPUUsedPct = pct
	total, avail, err := readMeminfo("/proc/meminfo")
	if err != nil {
		return nil, err
	}
	m.MemTotal, m.MemUsed = total, total-min(avail, total)
	m.MemTotalMB, m.MemUsedMB = m.MemTotal>>20, m.MemUsed>>20
	var fs syscall.Statfs_t
	if err := syscall.Statfs("/", &fs); err != nil {
		return nil, fmt.Errorf("statfs /: %w", err)
	}
	bs := uint64(fs.Bsize)
	m.DiskTotal = fs.Blocks * bs
	m.DiskUsed = (fs.Blocks - fs.Bfree) * bs
	return m, nil
}

func (c *cpuSampler) sample() (float64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	busy, total, err := readCPU("/proc/stat")
	if err != nil {
		return 0, err
	}
	if c.total == 0 {
		// First call: measure over a short window instead of since boot.
		time.Sleep(100 * time.Millisecond)
		c.busy, c.total = busy, total
		if busy, total, err = readCPU("/proc/stat"); err != nil {
			return 0, err
		}
	}
	if busy < c.busy || total <= c.total {
		c.busy, c.total = busy, total
		return 0, nil
	}
	db, dt := busy-c.busy, total-c.total
	c.busy, c.total = busy, total
	return float64(db) * 100 / float64(dt), nil
}

// readCPU returns busy and total jiffies from the aggregate "cpu" line.
func readCPU(path string) (busy, total uint64, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, fmt.Errorf("read %s: %w", path, err)
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("parse %s: no cpu line", path)
	}
	var vals []uint64
	for _, s := range f[1:] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("parse %s: %w", path, err)
		}
		vals = append(vals, v)
	}
	for _, v := range vals {
		total += v
	}
	idle := vals[3]
	if len(vals) > 4 {
		idle += vals[4] // iowait
	}
	return total - idle, total, nil
}

func readMeminfo(path string) (total, avail uint64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "MemTotal":
			total = n << 10
		case "MemAvailable":
			avail = n << 10
		}
	}
	if total == 0 {
		return 0, 0, fmt.Errorf("parse %s: no MemTotal", path)
	}
	return total, avail, sc.Err()
}
