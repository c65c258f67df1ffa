package qemu

import (
	"context"
	"fmt"
	"sort"
)

// VCPUThreads returns the host thread id of each vCPU, in vCPU index order
// (QMP query-cpus-fast), so the caller can set their CPU affinity. Under
// single-threaded TCG all vCPUs share one thread and the ids repeat. The
// threads exist from QEMU's start on, also while it waits for an incoming
// state, and live as long as the process.
func (m *machine) VCPUThreads(ctx context.Context) ([]int, error) {
	if err := m.alive(); err != nil {
		return nil, err
	}
	var cpus []struct {
		Index    int `json:"cpu-index"`
		ThreadID int `json:"thread-id"`
	}
	if err := m.qmp.Execute(ctx, "query-cpus-fast", nil, &cpus); err != nil {
		return nil, fmt.Errorf("vm %s: vcpu threads: %w", m.id, err)
	}
	sort.Slice(cpus, func(i, j int) bool { return cpus[i].Index < cpus[j].Index })
	tids := make([]int, 0, len(cpus))
	for _, c := range cpus {
		if c.ThreadID <= 0 {
			return nil, fmt.Errorf("vm %s: vcpu %d reports no host thread", m.id, c.Index)
		}
		tids = append(tids, c.ThreadID)
	}
	return tids, nil
}
