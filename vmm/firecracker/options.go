package firecracker

import (
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"path/filepath"
	"time"
)

// Options configure the Driver. The zero value runs "firecracker" from PATH
// directly (no jailer) with Firecracker's logger at Warning level.
type Options struct {
	// Binary is the firecracker executable; empty means "firecracker" from PATH.
	Binary string
	// Jailer, when set, starts every VMM through Firecracker's jailer.
	Jailer *JailerOptions
	// Log receives the driver's own log lines; nil means slog.Default().
	Log *slog.Logger
	// LogLevel is Firecracker's logger level (Error, Warning, Info, Debug);
	// its log goes to RunDir/firecracker.log. Empty means Warning.
	LogLevel string
	// Metrics, when true, has Firecracker flush metrics to RunDir/metrics.json.
	Metrics bool
	// TrackDirtyPages enables KVM dirty page tracking on boot and restore, which
	// Diff snapshots need. It costs some guest performance.
	TrackDirtyPages bool
	// Balloon, when set, adds a virtio-balloon device to every cold-booted
	// machine (restored machines keep the snapshot's devices).
	Balloon *BalloonOptions
	// MMDS, when set, enables the microVM metadata service on the listed
	// interfaces of every cold-booted machine.
	MMDS *MMDSOptions
	// StartTimeout bounds how long a fresh VMM may take to open its API
	// socket. Zero means 5 s.
	StartTimeout time.Duration
}

// JailerOptions describe how to start Firecracker through its jailer: the
// VMM runs chrooted in ChrootBase/<firecracker binary name>/<id>/root as
// UID:GID, optionally in a network namespace and cgroups. Files are linked
// into the chroot: writable drives are handed to UID:GID, read-only files
// (kernel, images, snapshots) must be readable by them; snapshots are left
// root:GID 0640, so jails sharing a GID can restore each other's.
type JailerOptions struct {
	Binary     string // jailer executable; empty means "jailer" from PATH
	ChrootBase string // --chroot-base-dir; empty means /srv/jailer
	UID, GID   int
	// NetNS is a network namespace path (for instance /var/run/netns/x) the
	// VMM joins when the machine's Config.NetNS is empty.
	NetNS string
	// CgroupVersion is 1 or 2; zero leaves the jailer's default.
	CgroupVersion int
	// Cgroups are "file=value" settings, each passed as --cgroup.
	Cgroups []string
	// ParentCgroup is --parent-cgroup; empty leaves the jailer's default.
	ParentCgroup string
}

// BalloonOptions configure a virtio-balloon device.
type BalloonOptions struct {
	AmountMiB             int64
	DeflateOnOOM          bool
	StatsPollingIntervalS int64
}

// MMDSOptions configure the microVM metadata service.
type MMDSOptions struct {
	Version     string   // "V1" or "V2"; empty means V2
	IPv4Address string   // empty means Firecracker's default 169.254.169.254
	Interfaces  []string // NIC IDs that may reach the MMDS; required
}

var logLevels = map[string]bool{"Error": true, "Warning": true, "Info": true, "Debug": true}

func (o *Options) withDefaults() (Options, error) {
	out := *o
	if out.Binary == "" {
		out.Binary = "firecracker"
	}
	if out.LogLevel == "" {
		out.LogLevel = "Warning"
	}
	if !logLevels[out.LogLevel] {
		return out, fmt.Errorf("firecracker: options: log level %q is not one of Error, Warning, Info, Debug", out.LogLevel)
	}
	if out.StartTimeout == 0 {
		out.StartTimeout = 5 * time.Second
	}
	if out.Log == nil {
		out.Log = slog.Default()
	}
	if out.MMDS != nil {
		if len(out.MMDS.Interfaces) == 0 {
			return out, errors.New("firecracker: options: MMDS needs at least one interface")
		}
		if v := out.MMDS.Version; v != "" && v != "V1" && v != "V2" {
			return out, fmt.Errorf("firecracker: options: MMDS version %q is not V1 or V2", v)
		}
	}
	if out.Balloon != nil && out.Balloon.AmountMiB < 0 {
		return out, fmt.Errorf("firecracker: options: balloon amount %d MiB is negative", out.Balloon.AmountMiB)
	}
	if j := out.Jailer; j != nil {
		jj := *j
		if jj.Binary == "" {
			jj.Binary = "jailer"
		}
		if jj.ChrootBase == "" {
			jj.ChrootBase = "/srv/jailer"
		}
		if !filepath.IsAbs(jj.ChrootBase) {
			return out, fmt.Errorf("firecracker: options: jailer chroot base %q must be absolute", jj.ChrootBase)
		}
		if jj.CgroupVersion != 0 && jj.CgroupVersion != 1 && jj.CgroupVersion != 2 {
			return out, fmt.Errorf("firecracker: options: cgroup version %d is not 1 or 2", jj.CgroupVersion)
		}
		out.Jailer = &jj
	}
	return out, nil
}

// resolveBinary finds name in PATH unless it is a path already.
func resolveBinary(what, name string) (string, error) {
	p, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("firecracker: %s binary %q: %w", what, name, err)
	}
	return filepath.Abs(p)
}
