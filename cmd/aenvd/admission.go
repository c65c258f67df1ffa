package main

import (
	"log/slog"

	"github.com/agentenv/agentenv/admission"
	"github.com/agentenv/agentenv/config"
	"github.com/agentenv/agentenv/sandbox"
)

// admissionController builds the node's admission limits from [admission]
// (package admission) and logs them.
// accel is the node's accelerator ("kvm", "tcg"; "" for drivers that do
// not say), which sets what each VMM costs besides its guest.
func admissionController(cfg config.Config, accel string, log *slog.Logger) *admission.Controller {
	hostMiB, err := admission.HostMemoryMiB()
	if err != nil {
		log.Warn("admission: host memory unknown; no derived committed-memory limit", "err", err)
	}
	lim := admission.FromConfig(cfg.Admission, cfg.DataDir, hostMiB)
	lim.VMMOverheadMiB = sandbox.VMMOverheadMiB(accel)
	log.Info("admission limits", "max_sandboxes", lim.MaxSandboxes, "max_committed_mib", lim.MaxCommittedMiB,
		"vmm_overhead_mib", lim.VMMOverheadMiB,
		"disk_reserve_mib", lim.DiskReserveBytes>>20, "max_fork_children", lim.MaxForkChildren,
		"max_connections", cfg.Admission.MaxConnections)
	return admission.New(lim)
}
