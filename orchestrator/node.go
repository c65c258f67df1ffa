package orchestrator

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/agentenv/agentenv/sandbox"

	"golang.org/x/sys/unix"
)

// NodeStats is the node snapshot behind /nodes.
type NodeStats struct {
	CPUCount                      int
	LoadAverage1m                 float64
	MemTotalMiB, MemUsedMiB       int64
	DiskTotalMiB, DiskUsedMiB     int64
	Running, Paused, Total        int
	AllocatedCPU                  int
	AllocatedMemMiB               int64
	CreateSuccesses, CreateFailed int64
	// How restored VMs get memory images, and how many distinct image
	// files the running VMs map (one per snapshot when shared).
	MemoryMode, MemoryReason string
	MemoryImages, MemoryVMs  int
}

// memoryMode says how VMs restored from a layered memory image map it
// (the API's NodeMemory.mode) and why.
func (o *Orchestrator) memoryMode() (mode, why string) {
	if o.memDev != nil {
		return "block-export", "every VM restored from a memory layer stack maps the storage daemon's shared read-only ublk device of it privately: one device per stack, its pages cached once, nothing flattened"
	}
	return "cache-file", "memory layer stacks are flattened once per snapshot into a node-local file that every VM restored from it maps privately (no shared device: " + o.memWhy + ")"
}

// memoryImages counts the distinct memory files the running VMs map.
func (o *Orchestrator) memoryImages() (images, vms int) {
	o.mu.Lock()
	all := make([]*instance, 0, len(o.sandboxes))
	for _, s := range o.sandboxes {
		all = append(all, s)
	}
	o.mu.Unlock()
	seen := map[[2]uint64]bool{}
	for _, s := range all {
		s.mu.Lock()
		file := s.rec.Memory.File
		if file == "" && s.vm != nil {
			file = s.machine().Info().MemoryFile
		}
		running := s.vm != nil
		s.mu.Unlock()
		var st unix.Stat_t
		if !running || file == "" || unix.Stat(file, &st) != nil {
			continue
		}
		vms++
		seen[[2]uint64{st.Dev, st.Ino}] = true
	}
	return len(seen), vms
}

// NodeStats samples /proc, the data directory's filesystem and the sandboxes.
func (o *Orchestrator) NodeStats() NodeStats {
	st := NodeStats{CPUCount: runtime.NumCPU(), CreateSuccesses: o.m.creates.Load(), CreateFailed: o.m.createFails.Load()}
	st.MemoryMode, st.MemoryReason = o.memoryMode()
	st.MemoryImages, st.MemoryVMs = o.memoryImages()
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			st.LoadAverage1m, _ = strconv.ParseFloat(f[0], 64)
		}
	}
	if total, avail, err := meminfo(); err == nil {
		st.MemTotalMiB, st.MemUsedMiB = total>>10, (total-avail)>>10
	}
	var fs unix.Statfs_t
	if unix.Statfs(o.cfg.DataDir, &fs) == nil {
		bs := int64(fs.Bsize)
		st.DiskTotalMiB = int64(fs.Blocks) * bs >> 20
		st.DiskUsedMiB = int64(fs.Blocks-fs.Bfree) * bs >> 20
	}
	for _, r := range o.List() {
		st.Total++
		if r.State == sandbox.Paused {
			st.Paused++
			continue
		}
		st.Running++
		st.AllocatedCPU += r.VCPUs
		st.AllocatedMemMiB += int64(r.MemoryMiB)
	}
	return st
}

// meminfo returns MemTotal and MemAvailable in KiB.
func meminfo() (total, avail int64, err error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, 0, err
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
	return total, avail, sc.Err()
}

// GuestMetrics is one sample of the agent's /metrics.
type GuestMetrics struct {
	TS         int64   `json:"ts"`
	CPUCount   int     `json:"cpu_count"`
	CPUUsedPct float64 `json:"cpu_used_pct"`
	MemTotal   int64   `json:"mem_total"`
	MemUsed    int64   `json:"mem_used"`
	DiskUsed   int64   `json:"disk_used"`
	DiskTotal  int64   `json:"disk_total"`
}

// Metrics samples a running sandbox's agent; nil for a paused one.
func (o *Orchestrator) Metrics(ctx context.Context, id string) (*GuestMetrics, error) {
	rec, err := o.Get(id)
	if err != nil {
		return nil, err
	}
	if rec.State == sandbox.Paused {
		return nil, nil
	}
	slot, _, err := o.Slot(id)
	if err != nil {
		return nil, err
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent/metrics", nil)
	if rec.AccessToken != "" {
		req.Header.Set("X-Access-Token", rec.AccessToken)
	}
	resp, err := sandbox.AgentClient(slot, 10*time.Second).Do(req)
	if err != nil {
		return nil, fmt.Errorf("sandbox %s metrics: %w", id, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return nil, fmt.Errorf("sandbox %s metrics: agent answered %s: %s", id, resp.Status, msg)
	}
	var m GuestMetrics
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&m); err != nil {
		return nil, fmt.Errorf("sandbox %s metrics: %w", id, err)
	}
	return &m, nil
}
