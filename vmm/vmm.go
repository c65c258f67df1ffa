// Package vmm owns the virtual-machine layer of AgentENV: one Driver interface
// that boots, pauses, resumes, snapshots, restores and stops microVMs, and the
// types shared by its drivers (vmm/qemu, vmm/firecracker).
//
// Everything above this package (sandboxes, templates, the node server) is
// written against Driver and Machine only; which VMM runs underneath is a
// deployment detail chosen by Select.
package vmm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"
)

// Driver starts virtual machines. Implementations must be safe for
// concurrent use: many machines run side by side.
type Driver interface {
	// Name is a short, stable identifier ("qemu", "firecracker").
	Name() string
	// Boot cold-boots a machine from cfg. When Boot returns, the VMM process
	// runs and the guest is booting; readiness of the guest is the caller's
	// concern (see the agent's health endpoint).
	Boot(ctx context.Context, cfg Config) (Machine, error)
	// Restore starts a new VMM process from a snapshot directory written by
	// Machine.Snapshot. The memory image is mapped privately (copy on write),
	// so any number of machines can be restored from one snapshot at once.
	Restore(ctx context.Context, cfg RestoreConfig) (Machine, error)
}

// Adopter is implemented by drivers that can take over a machine started by
// an earlier process (the node server restarted while its VMs ran on).
type Adopter interface {
	// Adopt reconnects to the machine whose run directory is runDir. It
	// fails with ErrStopped when the VMM process is gone.
	Adopt(ctx context.Context, runDir string) (Machine, error)
}

// Relocator is implemented by drivers whose snapshots name host files (the
// kernel a machine booted from) and so can be moved to another host: a
// snapshot taken elsewhere is pointed at the boot files a local snapshot of
// the same machine image names.
type Relocator interface {
	RelocateSnapshot(dir, reference string) error
}

// Preparer is implemented by drivers that can start a machine's VMM ahead
// of its restore (a warm pool of VMM processes): the process runs with its
// devices and memory image, waiting for the state of a snapshot of the same
// machine, and the restore that follows costs only the state's load.
type Preparer interface {
	// Prepare starts the VMM of cfg without loading its state: SnapshotDir
	// describes the machine (its devices, sizes, kernel), whose state any
	// snapshot of that machine can later bring (Prepared.Load). cfg's
	// MemoryLayers and Paused are not used here; Load takes its own.
	Prepare(ctx context.Context, cfg RestoreConfig) (Prepared, error)
}

// Prepared is a machine started by Preparer.Prepare, waiting for its state.
// Until Load returns it runs no guest; Stop ends it like any machine.
type Prepared interface {
	Machine
	// Move renames the machine's run directory to dir (on the same file
	// system; dir must not exist), so its files sit where its new owner
	// keeps a VM's (an Adopter finds it there). Only before Load.
	Move(dir string) error
	// Load writes the memory layers into the guest's RAM and loads the
	// state of snapshotDir, which must be a snapshot of the machine it was
	// prepared as (the same machine configuration); then the vCPUs run,
	// unless paused. A failed Load leaves the machine to be stopped.
	Load(ctx context.Context, snapshotDir string, memoryLayers []string, paused bool) error
}

// Detacher is implemented by machines whose handle can be dropped while the
// VMM keeps running (to be adopted by the next node process).
type Detacher interface {
	Detach() error
}

// DeviceSnapshotter is implemented by machines that can snapshot VM state
// without guest memory; the caller captures memory itself (vmm/memsnap) and
// restores with RestoreConfig.MemoryFile.
type DeviceSnapshotter interface {
	// SnapshotDevices writes the VM state but no guest RAM pages into dir
	// (created if needed). The VM must be paused (ErrNotPaused otherwise)
	// and stays paused; the caller resumes or stops it afterwards.
	//
	// The returned Snapshot has an empty MemoryFile: the directory holds no
	// memory image, and Restore of it fails unless RestoreConfig.MemoryFile
	// names a file (of MemBytes bytes) whose content equals guest RAM at
	// the time of the snapshot. Info().MemoryFile names the file the
	// machine's RAM is mapped from now; for a restored machine its own
	// writes are not in that file but in the VMM's private copy-on-write
	// pages, which the caller captures (while the machine is still paused)
	// and layers on top of it.
	//
	// SnapshotDevices does not run the guest, so memory captured before or
	// after it (during the same pause) matches the state. It fails with an
	// error wrapping ErrUnsupported when it cannot leave RAM out this time
	// (including a second snapshot within one pause); the caller falls back
	// to Machine.Snapshot, which may then let the guest run for an instant.
	SnapshotDevices(ctx context.Context, dir string) (*Snapshot, error)
}

// Resizer is implemented by machines whose guest memory can shrink and
// grow while they run (a virtio-balloon device). The ceiling is the RAM the
// machine was started or restored with; the guest gives pages back to the
// host below it and takes them again up to it. A machine without the device
// (vmm/qemu: one restored from a snapshot of a machine started before it
// existed) answers both with an error wrapping ErrUnsupported.
type Resizer interface {
	// SetMemory asks the guest to run on targetMiB of its RAM (at most the
	// ceiling). It returns once the request is posted: the guest's driver
	// gives or takes pages afterwards, at its own pace, and may not give
	// all (pages it cannot free stay with it).
	SetMemory(ctx context.Context, targetMiB int) error
	// Memory is the RAM the guest has now (the ceiling less what it gave
	// back), in MiB.
	Memory(ctx context.Context) (actualMiB int, err error)
	// Available is what the guest could give back without touching what
	// its processes hold (its MemAvailable: free memory and page cache it
	// can drop), in MiB, as its driver reports it when asked. A shrink
	// beyond it would leave the guest's next allocation to its OOM killer.
	Available(ctx context.Context) (availMiB int, err error)
}

// Confiner is implemented by drivers that run a machine's VMM as the
// unprivileged identity of Config.RunAs / RestoreConfig.RunAs, with only the
// files it needs in view. A driver without it is given no RunAs.
type Confiner interface {
	Confines() bool
}

// Identity is the uid and gid a confined VMM runs as. Each running machine
// gets one of its own: processes of one uid can signal each other, so two
// guests never share one.
type Identity struct {
	UID, GID uint32
}

// Machine is one running VMM process.
type Machine interface {
	// Pause stops the vCPUs. Pausing a paused machine is not an error.
	Pause(ctx context.Context) error
	// Resume starts the vCPUs again.
	Resume(ctx context.Context) error
	// Snapshot writes the VM state and its memory into dir (created if
	// missing). The machine must be paused and stays paused; the caller
	// resumes or stops it afterwards.
	Snapshot(ctx context.Context, dir string) (*Snapshot, error)
	// Stop ends the VMM process and removes every file it created under the
	// run directory. Stopping a stopped machine is not an error.
	Stop(ctx context.Context) error
	// Wait blocks until the VMM process exits and reports why.
	Wait(ctx context.Context) error
	// Info describes the process for monitoring and re-adoption.
	Info() Info
}

// Config describes a machine to cold-boot.
type Config struct {
	// ID names the machine in logs and file names; [a-zA-Z0-9_-]+.
	ID        string
	Kernel    string // path to the kernel image
	Initrd    string // optional initramfs
	Cmdline   string // kernel command line (the driver may append what it needs)
	VCPUs     int    // default 1
	MemoryMiB int    // default 256

	Drives []Drive
	NICs   []NIC

	// RunDir holds the machine's control socket, memory file and other
	// runtime files. It is created if missing and removed by Stop when the
	// driver created it.
	RunDir string
	// ConsoleLog receives the guest's serial console output. Empty means
	// RunDir/console.log.
	ConsoleLog string
	// NetNS is the path of a network namespace (/var/run/netns/x) the VMM
	// process runs in, for drivers that open taps by name (Firecracker):
	// NICs' TapName devices live there. Empty means the caller's namespace.
	// Drivers handed open Tap files need not use it.
	NetNS string
	// RunAs, when set, confines the VMM (see Confiner): it drops to this
	// identity before the guest runs. NBD sockets of its drives must then
	// let that identity connect (a VMM reconnects after a storage restart)
	// and share one directory.
	RunAs *Identity
}

// Drive is one virtio block device: a path, an NBD export, or both forms
// of one disk (an export attached to the kernel's NBD driver as Path), of
// which each driver takes the one it can use (QEMU the export, Firecracker
// the path).
//
// An Empty drive is a slot: a writable disk of size zero the guest probes
// at boot (it appears as a block device of no sectors) and a restore puts a
// real disk in its place (drivers implementing EmptyDriver). Devices cannot
// be added to a restored machine, so a disk a restore brings needs a slot
// the snapshot already has.
type Drive struct {
	ID       string // stable device id ("rootfs", "data0")
	Path     string // a regular file or block device on the host
	NBD      *NBDSource
	ReadOnly bool
	Empty    bool `json:",omitempty"`
}

// EmptyDriver is implemented by drivers whose machines take Empty drives.
type EmptyDriver interface {
	EmptyDrives() bool
}

// NBDDriver is implemented by drivers whose machines reach NBD exports over
// a Unix socket themselves (a Drive with NBD and no Path); other drivers
// open disks by path only.
type NBDDriver interface {
	SpeaksNBD() bool
}

// NBDSource is an NBD export reached over a Unix socket.
type NBDSource struct {
	Socket string
	Export string // export name; empty is the default export
}

// NIC is one virtio network interface backed by a tap device.
type NIC struct {
	ID  string // "eth0"
	MAC string // fixed: snapshot clones must keep the MAC of their origin
	// Tap is an open /dev/net/tun file already attached to a tap device
	// (see network or vmmtest). The driver hands it to the VMM; the caller
	// keeps ownership and may close it once Boot/Restore returned.
	Tap *os.File
	// TapName is the device name, for drivers that open taps by name
	// (Firecracker, in Config.NetNS). A node sets both forms; each driver
	// takes the one it can use.
	TapName string
}

// RestoreConfig describes a machine to start from a snapshot.
type RestoreConfig struct {
	ID          string
	SnapshotDir string
	// MemoryFile overrides the snapshot's memory image (for instance a
	// shared, node-wide copy of it). It is mapped privately. Required for
	// a snapshot written by DeviceSnapshotter.SnapshotDevices, whose
	// directory holds no memory image: then its content must equal guest
	// RAM at the time of that snapshot.
	MemoryFile string
	// MemoryLayers are sealed memory layers (vmm/memsnap) over MemoryFile,
	// bottom first: they are written into the VM's private copy of
	// MemoryFile before its state loads, so guest RAM is the flattened
	// stack without a flattened file. Requires MemoryFile.
	MemoryLayers []string
	// Drives and NICs replace the snapshot's devices of the same ID (a new
	// writable upper for the rootfs, a tap in a fresh network slot). The set
	// of IDs must match the snapshot's.
	Drives     []Drive
	NICs       []NIC
	RunDir     string
	ConsoleLog string
	NetNS      string    // as in Config
	RunAs      *Identity // as in Config
	// Paused leaves the vCPUs stopped after the state is loaded.
	Paused bool
}

// Snapshot is what Machine.Snapshot wrote.
type Snapshot struct {
	Dir        string
	StateFile  string // VMM device and CPU state
	MemoryFile string // guest memory image
	StateBytes int64
	MemBytes   int64 // logical size of the memory image
	Took       time.Duration
}

// Info describes a running machine's process.
type Info struct {
	Driver        string
	PID           int
	ControlSocket string // QMP or Firecracker API socket
	RunDir        string
	ConsoleLog    string
	Accel         string // "kvm" or "tcg" for QEMU; "kvm" for Firecracker
	MemoryFile    string // backing file of guest memory, if any
	// TSCkHz is the TSC frequency of the host the machine runs on, which
	// a TCG guest's TSC follows (0: not TCG, or unknown). The guest's agent
	// corrects its clock's rate by it after a restore.
	TSCkHz int
}

// Snapshot directory file names shared by every driver.
const (
	SnapshotStateFile  = "state"
	SnapshotMemoryFile = "memory"
	SnapshotConfigFile = "config.json"
)

// Errors a caller may branch on.
var (
	ErrStopped     = errors.New("vmm: machine is stopped")
	ErrNotPaused   = errors.New("vmm: machine must be paused")
	ErrUnsupported = errors.New("vmm: not supported by this driver")
)

// Defaults fills zero fields of cfg with the documented defaults and checks
// what can be checked without starting anything.
func (cfg *Config) Defaults() error {
	if cfg.VCPUs == 0 {
		cfg.VCPUs = 1
	}
	if cfg.MemoryMiB == 0 {
		cfg.MemoryMiB = 256
	}
	if err := validID(cfg.ID); err != nil {
		return err
	}
	if cfg.RunDir == "" {
		return errors.New("vmm: config: RunDir is required")
	}
	if cfg.VCPUs < 0 || cfg.VCPUs > 64 {
		return fmt.Errorf("vmm: config: vcpus %d out of range 1..64", cfg.VCPUs)
	}
	if cfg.MemoryMiB < 16 {
		return fmt.Errorf("vmm: config: memory %d MiB is below 16 MiB", cfg.MemoryMiB)
	}
	if err := mustBeFile("kernel", cfg.Kernel); err != nil {
		return err
	}
	if cfg.Initrd != "" {
		if err := mustBeFile("initrd", cfg.Initrd); err != nil {
			return err
		}
	}
	return CheckDevices(cfg.Drives, cfg.NICs)
}

// CheckDevices validates drive and NIC descriptions.
func CheckDevices(drives []Drive, nics []NIC) error {
	seen := map[string]bool{}
	for _, d := range drives {
		if err := validID(d.ID); err != nil {
			return fmt.Errorf("drive: %w", err)
		}
		if seen[d.ID] {
			return fmt.Errorf("vmm: drive id %q used twice", d.ID)
		}
		seen[d.ID] = true
		switch {
		case d.Empty:
			if d.NBD != nil || d.Path != "" || d.ReadOnly {
				return fmt.Errorf("vmm: drive %s: an empty slot has no path, export or read-only flag", d.ID)
			}
		case d.NBD != nil:
			if err := mustExist("drive "+d.ID+" nbd socket", d.NBD.Socket); err != nil {
				return err
			}
		default:
			if err := mustExist("drive "+d.ID, d.Path); err != nil {
				return err
			}
		}
	}
	for _, n := range nics {
		if err := validID(n.ID); err != nil {
			return fmt.Errorf("nic: %w", err)
		}
		if seen["nic:"+n.ID] {
			return fmt.Errorf("vmm: nic id %q used twice", n.ID)
		}
		seen["nic:"+n.ID] = true
		if _, err := ParseMAC(n.MAC); err != nil {
			return fmt.Errorf("vmm: nic %s: %w", n.ID, err)
		}
		if n.Tap == nil && n.TapName == "" {
			return fmt.Errorf("vmm: nic %s: no tap device", n.ID)
		}
	}
	return nil
}

func validID(id string) error {
	if id == "" || len(id) > 64 {
		return fmt.Errorf("vmm: id %q must be 1..64 characters", id)
	}
	for _, r := range id {
		ok := r == '-' || r == '_' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9')
		if !ok {
			return fmt.Errorf("vmm: id %q: only letters, digits, '-' and '_' are allowed", id)
		}
	}
	return nil
}

func mustExist(what, path string) error {
	if path == "" {
		return fmt.Errorf("vmm: %s: no path given", what)
	}
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("vmm: %s: %w", what, err)
	}
	return nil
}

func mustBeFile(what, path string) error {
	if path == "" {
		return fmt.Errorf("vmm: %s: no path given", what)
	}
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("vmm: %s: %w", what, err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("vmm: %s %s: not a regular file", what, path)
	}
	if st.Size() == 0 {
		return fmt.Errorf("vmm: %s %s: file is empty", what, path)
	}
	return nil
}

// TCGTranslationCacheMiB bounds the translation cache of a VMM that
// emulates the guest's CPU (QEMU's TCG: -accel tcg,tb-size). QEMU's own
// default is 1 GiB per VMM, filled as the guest runs new code and never
// given back, which a node of dozens of sandboxes cannot afford; a Linux
// guest's hot code fits in a fraction of this.
const TCGTranslationCacheMiB = 256
