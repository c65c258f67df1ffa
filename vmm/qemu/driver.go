// Package qemu is the QEMU driver of the vmm layer: `-M microvm` machines
// controlled over QMP. Guest memory is a file-backed memory backend, so a
// snapshot's saved state stays tiny (the x-ignore-shared migration
// capability leaves shared RAM out of it) and restores map the memory image
// privately: any number of clones share one image copy-on-write. A restored
// machine's RAM is private, so x-ignore-shared no longer applies to it;
// SnapshotDevices (vmm.DeviceSnapshotter) then saves the device state alone
// without walking RAM, and the caller keeps the memory itself.
//
// It runs under KVM when a test guest boots with it and under TCG
// (software emulation) otherwise; Accel reports which and why.
package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/vmm/memsnap"
)

// Options configure the driver.
type Options struct {
	// Binary is the QEMU executable; default qemu-system-x86_64.
	Binary string
	// Accel forces "kvm" or "tcg"; empty detects (see DetectAccel).
	Accel string
	// ProbeKernel is the kernel booted to test KVM; required when Accel is empty.
	ProbeKernel string
	Log         *slog.Logger
}

// Driver implements vmm.Driver with QEMU.
type Driver struct {
	binary      string
	accel       string
	accelReason string
	tscKHz      int
	log         *slog.Logger
	tune        tuning
}

// tuning holds settings the restore torture test varies to compare the
// rates of guest panics after restores (export_test.go sets them); a
// driver of a node leaves them zero.
type tuning struct {
	cpu, tcg string // machineSpec.CPU and TCG of the machines it boots
	// restoreShared maps a restore's memory file shared (share=on): the
	// guest then writes into the file, so each restore needs its own copy.
	restoreShared bool
}

var _ vmm.Driver = (*Driver)(nil)

// New checks that QEMU is installed and chooses the accelerator.
func New(ctx context.Context, opts Options) (*Driver, error) {
	if opts.Binary == "" {
		opts.Binary = "qemu-system-x86_64"
	}
	bin, err := exec.LookPath(opts.Binary)
	if err != nil {
		return nil, fmt.Errorf("qemu driver: %s not found (apt-get install qemu-system-x86): %w", opts.Binary, err)
	}
	if bin, err = filepath.Abs(bin); err != nil { // records and the jail name it absolutely
		return nil, fmt.Errorf("qemu driver: %w", err)
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	d := &Driver{binary: bin, accel: opts.Accel, tscKHz: HostTSCkHz(), log: opts.Log}
	switch opts.Accel {
	case "kvm", "tcg":
		d.accelReason = "configured"
	case "":
		if opts.ProbeKernel == "" {
			return nil, errors.New("qemu driver: ProbeKernel is required to detect the accelerator")
		}
		d.accel, d.accelReason = DetectAccel(ctx, bin, opts.ProbeKernel)
	default:
		return nil, fmt.Errorf("qemu driver: unknown accelerator %q (want kvm or tcg)", opts.Accel)
	}
	d.log.Info("qemu driver ready", "binary", bin, "accel", d.accel, "why", d.accelReason)
	return d, nil
}

// Name implements vmm.Driver.
func (d *Driver) Name() string { return "qemu" }

// EmptyDrives implements vmm.EmptyDriver: a slot is a null block device.
func (d *Driver) EmptyDrives() bool { return true }

// SpeaksNBD implements vmm.NBDDriver: QEMU's own NBD client reaches exports
// over their sockets and reconnects after the server restarts.
func (d *Driver) SpeaksNBD() bool { return true }

// MapsDeviceMemory reports that a restore's MemoryFile may be a block
// device (a shared read-only ublk device of a memory layer stack): QEMU maps
// it privately like a file (storage/daemon/vmtest checks it in the kernel
// lane).
func (d *Driver) MapsDeviceMemory() bool { return true }

// Accel reports the accelerator in use and why it was chosen.
func (d *Driver) Accel() (accel, reason string) { return d.accel, d.accelReason }

// Boot implements vmm.Driver.
func (d *Driver) Boot(ctx context.Context, cfg vmm.Config) (vmm.Machine, error) {
	if err := cfg.Defaults(); err != nil {
		return nil, err
	}
	spec := &machineSpec{
		Version: specVersion, Kernel: abs(cfg.Kernel), Initrd: abs(cfg.Initrd),
		Cmdline: kernelCmdline(cfg.Cmdline, d.accel, d.tscKHz),
		VCPUs:   cfg.VCPUs, MemoryMiB: cfg.MemoryMiB, Accel: d.accel, Drives: cfg.Drives, RunAs: cfg.RunAs,
		CPU: d.tune.cpu, TCG: d.tune.tcg,
	}
	for _, n := range cfg.NICs {
		spec.NICs = append(spec.NICs, savedNIC{ID: n.ID, MAC: n.MAC})
	}
	rd, err := newRunDir(cfg.RunDir, cfg.ConsoleLog)
	if err != nil {
		return nil, err
	}
	mem := memorySource{path: filepath.Join(rd.dir, "memory"), shared: true}
	if err := createMemoryFile(mem.path, cfg.MemoryMiB); err != nil {
		rd.cleanup()
		return nil, err
	}
	rd.own(mem.path)
	tapFiles, closeTaps, err := taps(cfg.NICs)
	if err != nil {
		rd.cleanup()
		return nil, fmt.Errorf("boot %s: %w", cfg.ID, err)
	}
	defer closeTaps()
	m, err := d.start(ctx, cfg.ID, spec, mem, tapFiles, rd, false)
	if err != nil {
		return nil, fmt.Errorf("boot %s: %w", cfg.ID, err)
	}
	return m, nil
}

// Restore implements vmm.Driver: a VMM started waiting for its state
// (prepare), then the state loaded into it.
func (d *Driver) Restore(ctx context.Context, rc vmm.RestoreConfig) (vmm.Machine, error) {
	if rc.MemoryFile == "" && len(rc.MemoryLayers) > 0 {
		return nil, fmt.Errorf("restore %s: memory layers need the MemoryFile they lie on", rc.SnapshotDir)
	}
	m, err := d.prepare(ctx, rc)
	if err != nil {
		return nil, err
	}
	if err := m.load(ctx, rc.SnapshotDir, rc.MemoryLayers, !rc.Paused); err != nil {
		_ = m.Stop(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("restore %s from %s: %w", rc.ID, rc.SnapshotDir, err)
	}
	return m, nil
}

// prepare starts the QEMU of the machine rc.SnapshotDir describes, with
// rc's devices and memory file, waiting for its state (-incoming defer).
func (d *Driver) prepare(ctx context.Context, rc vmm.RestoreConfig) (*machine, error) {
	spec, err := readSpec(rc.SnapshotDir)
	if err != nil {
		return nil, err
	}
	if spec.Accel != d.accel {
		return nil, fmt.Errorf("restore %s: snapshot was taken under %s, this driver runs %s", rc.SnapshotDir, spec.Accel, d.accel)
	}
	if rc.ID == "" {
		rc.ID = "restored"
	}
	if rc.RunDir == "" {
		return nil, errors.New("restore: RunDir is required")
	}
	nics, err := mergeDevices(spec, rc)
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w", rc.SnapshotDir, err)
	}
	mem := memorySource{path: rc.MemoryFile, shared: d.tune.restoreShared}
	if mem.shared && mem.path == "" {
		return nil, fmt.Errorf("restore %s: a shared mapping writes the memory image: RestoreConfig.MemoryFile must name a copy", rc.SnapshotDir)
	}
	if mem.path == "" {
		if spec.NoMemory {
			return nil, fmt.Errorf("restore %s: the snapshot holds no guest memory (SnapshotDevices): RestoreConfig.MemoryFile is required", rc.SnapshotDir)
		}
		mem.path = filepath.Join(rc.SnapshotDir, vmm.SnapshotMemoryFile)
	}
	spec.NoMemory = false // the restored machine's own spec
	spec.RunAs = rc.RunAs // its own identity, never the snapshot's
	if err := checkMemoryImage(mem.path, spec.MemoryMiB); err != nil {
		return nil, fmt.Errorf("restore %s: %w", rc.SnapshotDir, err)
	}
	rd, err := newRunDir(rc.RunDir, rc.ConsoleLog)
	if err != nil {
		return nil, err
	}
	m, err := d.start(ctx, rc.ID, spec, mem, nics, rd, true)
	if err != nil {
		return nil, fmt.Errorf("restore %s: %w", rc.ID, err)
	}
	return m, nil
}

// load writes the memory layers into the guest RAM of a machine waiting
// for its state and then loads the state of snapshotDir (running the vCPUs
// when run).
func (m *machine) load(ctx context.Context, snapshotDir string, layers []string, run bool) error {
	stateFile, err := os.Open(filepath.Join(snapshotDir, vmm.SnapshotStateFile))
	if err != nil {
		return fmt.Errorf("state of %s: %w", snapshotDir, err)
	}
	defer stateFile.Close()
	// Before the state loads: devices read guest RAM as they load (virtio
	// checks its rings), and it must be the guest's by then.
	if err := m.writeMemoryLayers(ctx, layers); err != nil {
		return err
	}
	return m.loadState(ctx, stateFile, run)
}

// writeMemoryLayers writes layers into the guest RAM of a machine that
// waits for its incoming state (nothing else writes it then).
func (m *machine) writeMemoryLayers(ctx context.Context, layers []string) error {
	if len(layers) == 0 {
		return nil
	}
	st, err := memsnap.WriteLayers(ctx, m.proc.Pid, m.mem.path, layers)
	if err != nil {
		return err
	}
	m.log.Info("memory layers written into guest RAM", "layers", len(layers), "pages", st.Pages,
		"zero_pages", st.ZeroPages, "took", st.Took.Round(time.Millisecond))
	return nil
}

// mergeDevices applies the restore's device overrides to the saved spec and
// returns the tap files in NIC order.
func mergeDevices(spec *machineSpec, rc vmm.RestoreConfig) ([]*os.File, error) {
	for _, o := range rc.Drives {
		found := false
		for i := range spec.Drives {
			if spec.Drives[i].ID == o.ID {
				spec.Drives[i], found = o, true
			}
		}
		if !found {
			return nil, fmt.Errorf("drive %q is not in the snapshot", o.ID)
		}
	}
	byID := map[string]vmm.NIC{}
	for _, n := range rc.NICs {
		byID[n.ID] = n
	}
	var files []*os.File
	for _, saved := range spec.NICs {
		n, ok := byID[saved.ID]
		if !ok || n.Tap == nil {
			return nil, fmt.Errorf("nic %s: the snapshot has it, so the restore needs a tap for it", saved.ID)
		}
		if n.MAC != "" && n.MAC != saved.MAC {
			return nil, fmt.Errorf("nic %s: MAC %s differs from the snapshot's %s (the guest keeps its MAC)", saved.ID, n.MAC, saved.MAC)
		}
		delete(byID, saved.ID)
		files = append(files, n.Tap)
	}
	for id := range byID {
		return nil, fmt.Errorf("nic %q is not in the snapshot", id)
	}
	if err := vmm.CheckDevices(spec.Drives, nil); err != nil {
		return nil, err
	}
	return files, nil
}

func readSpec(dir string) (*machineSpec, error) {
	b, err := os.ReadFile(filepath.Join(dir, vmm.SnapshotConfigFile))
	if err != nil {
		return nil, fmt.Errorf("read snapshot %s: %w", dir, err)
	}
	var spec machineSpec
	if err := json.Unmarshal(b, &spec); err != nil {
		return nil, fmt.Errorf("read snapshot %s: config: %w", dir, err)
	}
	if spec.Version < minSpecVersion || spec.Version > specVersion {
		return nil, fmt.Errorf("read snapshot %s: config version %d, want %d to %d", dir, spec.Version, minSpecVersion, specVersion)
	}
	if spec.MemoryMiB < 16 || spec.VCPUs < 1 || spec.Kernel == "" {
		return nil, fmt.Errorf("read snapshot %s: config is incomplete", dir)
	}
	return &spec, nil
}

// taps returns one open tap file per NIC, opening by name (in our own
// network namespace) those given only by name; closeTaps closes only those.
func taps(nics []vmm.NIC) (files []*os.File, closeTaps func(), err error) {
	var opened []*os.File
	closeTaps = func() {
		for _, f := range opened {
			f.Close()
		}
	}
	for _, n := range nics {
		f := n.Tap
		if f == nil {
			if f, err = vmm.OpenTap(n.TapName); err != nil {
				closeTaps()
				return nil, nil, fmt.Errorf("nic %s: %w", n.ID, err)
			}
			opened = append(opened, f)
		}
		files = append(files, f)
	}
	return files, closeTaps, nil
}

// checkMemoryImage fails early on a memory image QEMU would refuse (or map
// short, faulting the guest later). Block devices are not sized here.
func checkMemoryImage(path string, mib int) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("memory image: %w", err)
	}
	defer f.Close()
	// The end of a block device is its size, where Stat reports none.
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return fmt.Errorf("memory image %s: size: %w", path, err)
	}
	if want := int64(mib) << 20; size < want {
		return fmt.Errorf("memory image %s is %d bytes, guest RAM is %d", path, size, want)
	}
	return nil
}

func createMemoryFile(path string, mib int) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("create memory file: %w", err)
	}
	defer f.Close()
	if err := f.Truncate(int64(mib) << 20); err != nil {
		return fmt.Errorf("size memory file %s: %w", path, err)
	}
	return nil
}

func abs(p string) string {
	if p == "" {
		return ""
	}
	a, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	return a
}
