package config

import "fmt"

// Admission bounds what the node commits (docs/security.md, "Admission"):
// a create, resume or fork crossing a limit is refused with 429 (count
// limits) or 503 (memory and disk) and a Retry-After. Zero turns a limit off.
type Admission struct {
	// MaxSandboxes bounds the sandboxes running (or starting, or resuming)
	// at once; above it a create or resume answers 429.
	MaxSandboxes int `toml:"max_sandboxes" env:"AENVD_ADMISSION_MAX_SANDBOXES"`
	// MaxCommittedMiB bounds the guest memory committed at once: running
	// sandboxes, the VMM warm pool's reservations and the creates and
	// resumes in flight; above it they answer 503. Zero derives it: the
	// host's memory less HostReserveMiB, times MemoryOvercommitPct/100.
	MaxCommittedMiB int `toml:"max_committed_mib" env:"AENVD_ADMISSION_MAX_COMMITTED_MIB"`
	// MemoryOvercommitPct is the percentage of the host's memory (less
	// HostReserveMiB) the derived committed-memory limit allows; above 100
	// counts on guests not touching all their memory.
	MemoryOvercommitPct int `toml:"memory_overcommit_pct" env:"AENVD_ADMISSION_MEMORY_OVERCOMMIT_PCT"`
	// HostReserveMiB is the host memory kept out of the derived limit for
	// aenvd, the storage daemon and the page cache.
	HostReserveMiB int `toml:"host_reserve_mib" env:"AENVD_ADMISSION_HOST_RESERVE_MIB"`
	// DiskReserveMiB is the free space a create or resume must find on
	// data_dir's file system (503 below it).
	DiskReserveMiB int `toml:"disk_reserve_mib" env:"AENVD_ADMISSION_DISK_RESERVE_MIB"`
	// MaxForkChildren bounds the fork children in flight (asked by forks
	// not finished yet); a fork above it answers 429.
	MaxForkChildren int `toml:"max_fork_children" env:"AENVD_ADMISSION_MAX_FORK_CHILDREN"`
	// MaxConnections bounds the connections each listener (API, proxy)
	// holds from all clients together, besides [network] conns_per_client
	// per client address; a connection above it is closed at once.
	MaxConnections int `toml:"max_connections" env:"AENVD_ADMISSION_MAX_CONNECTIONS"`
}

// validate refuses negative limits and an overcommit out of range.
func (a Admission) validate() error {
	switch {
	case a.MaxSandboxes < 0 || a.MaxCommittedMiB < 0 || a.HostReserveMiB < 0 ||
		a.DiskReserveMiB < 0 || a.MaxForkChildren < 0 || a.MaxConnections < 0:
		return fmt.Errorf("config: admission: limits must not be negative (zero turns one off)")
	case a.MemoryOvercommitPct < 0 || a.MemoryOvercommitPct > 1600:
		return fmt.Errorf("config: admission.memory_overcommit_pct %d is not within 0..1600 (0 turns the derived limit off)", a.MemoryOvercommitPct)
	}
	return nil
}
