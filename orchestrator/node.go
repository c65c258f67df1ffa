package orchestrator

import (
	"context"

	"github.com/agentenv/agentenv/sandbox"
	"github.com/agentenv/agentenv/telemetry"
)

// NodeStats is the node snapshot behind /nodes.
type NodeStats struct {
	telemetry.Host
	Running, Paused, Total        int
	AllocatedCPU                  int
	AllocatedMemMiB               int64
	CreateSuccesses, CreateFailed int64
	// How restored VMs get memory images, and how many distinct image
	// files the running VMs map (one per snapshot when shared).
	MemoryMode, MemoryReason string
	MemoryImages, MemoryVMs  int
}

// GuestMetrics is one sample of a guest agent's /metrics.
type GuestMetrics = telemetry.GuestMetrics

// memoryMode says how VMs restored from a layered memory image map it
// (the API's NodeMemory.mode) and why.
func (o *Orchestrator) memoryMode() (mode, why string) {
	if o.memDev != nil {
		return "block-export", "every VM restored from a memory layer stack maps the storage daemon's shared read-only " + o.memDev.Describe() +
			" of it privately: one export per stack, its pages cached once, nothing flattened or written in; layers brought from the repository are read lazily"
	}
	return "cache-file", "memory layer stacks are flattened once per snapshot into a node-local file that every VM restored from it maps privately (no shared device: " + o.memWhy + ")"
}

// MemoryExports reports whether VMs map their memory from the storage
// daemon's shared exports (then the repository brings memory layers
// lazily: replica.Options.LazyMemory).
func (o *Orchestrator) MemoryExports() bool { return o.memDev != nil }

// mappedMemory lists the memory files the running VMs map.
func (o *Orchestrator) mappedMemory() []string {
	o.mu.Lock()
	all := make([]*instance, 0, len(o.sandboxes))
	for _, s := range o.sandboxes {
		all = append(all, s)
	}
	o.mu.Unlock()
	var files []string
	for _, s := range all {
		s.mu.Lock()
		if s.vm != nil {
			file := s.rec.Memory.File
			if file == "" {
				file = s.machine().Info().MemoryFile
			}
			files = append(files, file)
		}
		s.mu.Unlock()
	}
	return files
}

// NodeStats samples the host (telemetry.SampleHost) and the sandboxes.
func (o *Orchestrator) NodeStats() NodeStats {
	st := NodeStats{Host: telemetry.SampleHost(o.cfg.DataDir), CreateSuccesses: o.m.Creates.Load(), CreateFailed: o.m.CreateFails.Load()}
	st.MemoryMode, st.MemoryReason = o.memoryMode()
	st.MemoryImages, st.MemoryVMs = telemetry.MappedImages(o.mappedMemory())
	for _, r := range o.List() {
		st.Total++
		if r.State == sandbox.Paused {
			st.Paused++
			continue
		}
		st.Running++
		st.AllocatedCPU += r.VCPUs
		st.AllocatedMemMiB += int64(r.CommittedMemoryMiB())
	}
	return st
}

// Metrics samples a running sandbox's agent (telemetry.Metrics); nil for a
// paused one.
func (o *Orchestrator) Metrics(ctx context.Context, id string) (*GuestMetrics, error) {
	rec, err := o.Get(id)
	if err != nil || rec.State == sandbox.Paused {
		return nil, err
	}
	slot, _, err := o.Slot(id)
	if err != nil {
		return nil, err
	}
	return telemetry.Metrics(ctx, id, slot, rec.AccessToken)
}

// AgentLogs returns a running sandbox's agent's recent log lines
// (telemetry.AgentLogs), nil for a sandbox that does not run.
func (o *Orchestrator) AgentLogs(ctx context.Context, id string) ([]byte, error) {
	rec, err := o.Get(id)
	if err != nil || rec.State != sandbox.Running {
		return nil, err
	}
	slot, _, err := o.Slot(id)
	if err != nil {
		return nil, nil
	}
	return telemetry.AgentLogs(ctx, id, slot, rec.AccessToken)
}

// ConsoleLog returns the path of a sandbox's guest console log (the
// kernel's and the guest agent's lines) while its VM runs, "" while it has
// none (paused: the console goes with the stopped VM).
func (o *Orchestrator) ConsoleLog(id string) (string, error) {
	s, err := o.lookup(id)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.vm == nil || s.vm.Machine == nil {
		return "", nil
	}
	return s.vm.Machine.Info().ConsoleLog, nil
}
