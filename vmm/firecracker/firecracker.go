// Package firecracker is the Firecracker driver of the vmm layer: it starts
// a firecracker process per machine (directly, or through Firecracker's
// jailer), configures it over Firecracker's HTTP API on a Unix socket, and
// implements vmm.Driver and vmm.Machine on top: boot, pause, resume, full and
// diff snapshots, restore from a privately mapped memory file, stop.
//
// The API calls go through the generated client and models of the official
// firecracker-go-sdk (API 1.4.1); only the SDK's client packages are used,
// not its machine runner, so process handling, the jailer layout and clean-up
// follow this package's own rules.
//
// Firecracker opens block devices and taps by path and name: NBD drives must
// be attached to /dev/nbdN first (vmm.ErrUnsupported otherwise) and NICs need
// TapName, a tap nobody else holds open, inside Config.NetNS when the
// sandbox has its own network namespace. The guest's serial console is
// Firecracker's standard output, which the driver sends to the console log.
//
// Snapshots record drives by the path Firecracker saw. Run directly, that is
// the host path, so a restore needs the snapshot-time drive files to exist
// (Firecracker reopens them while loading) and then repoints replaced drives
// before resuming. Under the jailer every file has a stable name inside the
// chroot ("/drive-rootfs"), so restored machines take any host files.
package firecracker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/firecracker-microvm/firecracker-go-sdk/client/models"

	"github.com/agentenv/agentenv/vmm"
)

// Name is the driver's stable identifier.
const Name = "firecracker"

// maxVCPUs is Firecracker's limit (machine-config vcpu_count maximum).
const maxVCPUs = 32

// Driver implements vmm.Driver with Firecracker.
type Driver struct {
	opts      Options
	fcBin     string
	jailerBin string
}

var _ vmm.Driver = (*Driver)(nil)

// New checks opts and resolves the executables.
func New(opts Options) (*Driver, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	d := &Driver{opts: o}
	if d.fcBin, err = resolveBinary("firecracker", o.Binary); err != nil {
		return nil, err
	}
	if o.Jailer != nil {
		if d.jailerBin, err = resolveBinary("jailer", o.Jailer.Binary); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// Name implements vmm.Driver.
func (d *Driver) Name() string { return Name }

// errRunAs refuses a per-machine identity: this driver confines through
// the jailer's one configured UID:GID (Options.Jailer), not vmm.Confiner.
var errRunAs = errors.New("firecracker: per-machine RunAs is not supported (configure the jailer's UID:GID)")

// Boot implements vmm.Driver.
func (d *Driver) Boot(ctx context.Context, cfg vmm.Config) (vmm.Machine, error) {
	if cfg.RunAs != nil {
		return nil, errRunAs
	}
	m, err := d.boot(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("firecracker: boot %s: %w", cfg.ID, err)
	}
	return m, nil
}

func (d *Driver) boot(ctx context.Context, cfg vmm.Config) (*Machine, error) {
	if err := cfg.Defaults(); err != nil {
		return nil, err
	}
	if cfg.VCPUs > maxVCPUs {
		return nil, fmt.Errorf("vcpus %d: Firecracker allows at most %d", cfg.VCPUs, maxVCPUs)
	}
	if err := checkFirecrackerDevices(cfg.Drives, cfg.NICs); err != nil {
		return nil, err
	}
	// Firecracker resolves relative paths against its own working directory,
	// and snapshots record them: make them absolute once, here.
	cfg.Drives = append([]vmm.Drive(nil), cfg.Drives...)
	if err := absPaths(&cfg.Kernel, &cfg.Initrd, &cfg.RunDir, &cfg.ConsoleLog); err != nil {
		return nil, err
	}
	for i := range cfg.Drives {
		if err := absPaths(&cfg.Drives[i].Path); err != nil {
			return nil, err
		}
	}
	m, err := d.launch(ctx, cfg.ID, cfg.RunDir, cfg.ConsoleLog, cfg.NetNS)
	if err != nil {
		return nil, err
	}
	if err := m.configureBoot(ctx, cfg); err != nil {
		err = m.proc.blame(err)
		m.teardown()
		return nil, err
	}
	m.log().Info("firecracker: booted", "id", cfg.ID, "pid", m.proc.pid(), "vcpus", cfg.VCPUs, "memory_mib", cfg.MemoryMiB, "jailed", m.lay.jailed)
	return m, nil
}

// checkFirecrackerDevices rejects what Firecracker cannot take: it opens
// drives by path and taps by name.
func checkFirecrackerDevices(drives []vmm.Drive, nics []vmm.NIC) error {
	for _, dr := range drives {
		if dr.Empty {
			return fmt.Errorf("drive %s: empty drive slots are a QEMU feature: %w", dr.ID, vmm.ErrUnsupported)
		}
		if dr.NBD != nil && dr.Path == "" {
			return fmt.Errorf("drive %s: NBD socket %s: Firecracker takes file or block-device paths only; attach the export to /dev/nbdN first: %w", dr.ID, dr.NBD.Socket, vmm.ErrUnsupported)
		}
	}
	for _, n := range nics {
		if n.TapName == "" {
			return fmt.Errorf("nic %s: Firecracker opens taps by name and TapName is empty; an open Tap file cannot be handed over (use a persistent tap, in Config.NetNS if it lives in another namespace): %w", n.ID, vmm.ErrUnsupported)
		}
	}
	return nil
}

// launch creates the run directory, starts the VMM and sets up its logger
// and metrics; everything else is boot- or restore-specific.
func (d *Driver) launch(ctx context.Context, id, runDir, console, netns string) (m *Machine, err error) {
	m = &Machine{d: d, id: id, runDir: runDir}
	defer func() {
		if err != nil {
			if m.proc != nil {
				err = m.proc.blame(err)
			}
			m.teardown()
			m = nil
		}
	}()
	if netns != "" {
		if _, err := os.Stat(netns); err != nil {
			return m, fmt.Errorf("network namespace: %w", err)
		}
	}
	if err := m.makeRunDir(); err != nil {
		return m, err
	}
	fcID := instanceID(id)
	if m.lay, err = newLayout(runDir, d.opts.Jailer, d.fcBin, fcID); err != nil {
		return m, err
	}
	if err := m.openConsole(console); err != nil {
		return m, err
	}
	m.socket = m.lay.hostPath(socketName)
	if err := checkSocketPath(m.socket); err != nil {
		return m, err
	}
	if err := removeStale(m.socket); err != nil {
		return m, err
	}
	m.own(m.socket)
	// The jailer passes --id to Firecracker itself.
	fcArgs := []string{"--api-sock", m.lay.vmPath(socketName)}
	argv := append([]string{d.fcBin, "--id", fcID}, fcArgs...)
	if d.opts.Jailer != nil {
		// The jailer joins the namespace itself, after its own set-up.
		j := *d.opts.Jailer
		if netns != "" {
			j.NetNS = netns
		}
		argv = jailerArgs(&j, d.jailerBin, d.fcBin, fcID, fcArgs)
		netns = ""
	}
	m.proc, err = startProc(argv, m.consoleFile, netns)
	if err != nil {
		return m, err
	}
	if err := m.proc.waitSocket(ctx, m.socket, d.opts.StartTimeout); err != nil {
		return m, err
	}
	m.api = newClient(m.socket)
	return m, m.setupLogging(ctx)
}

const (
	socketName  = "firecracker.sock"
	logName     = "firecracker.log"
	metricsName = "metrics.json"
)

func (m *Machine) makeRunDir() error {
	if _, err := os.Stat(m.runDir); errors.Is(err, os.ErrNotExist) {
		m.createdRunDir = true
	}
	if err := os.MkdirAll(m.runDir, 0o750); err != nil {
		m.createdRunDir = false
		return fmt.Errorf("create run dir %s: %w", m.runDir, err)
	}
	return nil
}

func (m *Machine) openConsole(path string) error {
	if path == "" {
		path = filepath.Join(m.runDir, "console.log")
	}
	// A console log the caller placed outside the run directory is theirs
	// to keep after Stop.
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) && filepath.Dir(path) == filepath.Clean(m.runDir) {
		m.own(path)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return fmt.Errorf("console log %s: %w", path, err)
	}
	m.console, m.consoleFile = path, f
	return nil
}

func removeStale(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket %s: %w", path, err)
	}
	return nil
}

func (m *Machine) setupLogging(ctx context.Context) error {
	o := m.d.opts
	m.own(m.lay.hostPath(logName))
	logPath, err := m.lay.touch(logName)
	if err != nil {
		return err
	}
	level := o.LogLevel
	showLevel := true
	if err := m.api.putLogger(ctx, &models.Logger{LogPath: &logPath, Level: &level, ShowLevel: &showLevel}); err != nil {
		return err
	}
	if !o.Metrics {
		return nil
	}
	m.own(m.lay.hostPath(metricsName))
	metricsPath, err := m.lay.touch(metricsName)
	if err != nil {
		return err
	}
	return m.api.putMetrics(ctx, &models.Metrics{MetricsPath: &metricsPath})
}

// configureBoot sends the pre-boot configuration and starts the guest.
func (m *Machine) configureBoot(ctx context.Context, cfg vmm.Config) error {
	o := m.d.opts
	vcpus, mem := int64(cfg.VCPUs), int64(cfg.MemoryMiB)
	smt, track := false, o.TrackDirtyPages
	if err := m.api.putMachineConfig(ctx, &models.MachineConfiguration{VcpuCount: &vcpus, MemSizeMib: &mem, Smt: &smt, TrackDirtyPages: &track}); err != nil {
		return err
	}
	kernel, err := m.lay.expose(cfg.Kernel, "kernel", false)
	if err != nil {
		return err
	}
	bs := &models.BootSource{KernelImagePath: &kernel, BootArgs: bootArgs(cfg.Cmdline)}
	if cfg.Initrd != "" {
		if bs.InitrdPath, err = m.lay.expose(cfg.Initrd, "initrd", false); err != nil {
			return err
		}
	}
	if err := m.api.putBootSource(ctx, bs); err != nil {
		return err
	}
	if err := m.attachDevices(ctx, cfg.Drives, cfg.NICs); err != nil {
		return err
	}
	if err := m.attachExtras(ctx); err != nil {
		return err
	}
	if err := m.api.action(ctx, models.InstanceActionInfoActionTypeInstanceStart); err != nil {
		return err
	}
	m.meta = snapshotConfig{
		Driver: Name, Format: configFormat, VCPUs: cfg.VCPUs, MemoryMiB: cfg.MemoryMiB,
		Kernel: cfg.Kernel, Initrd: cfg.Initrd, Cmdline: bs.BootArgs, Jailed: m.lay.jailed,
		Drives: m.meta.Drives, NICs: m.meta.NICs, TrackDirtyPages: track,
	}
	return nil
}

func (m *Machine) attachDevices(ctx context.Context, drives []vmm.Drive, nics []vmm.NIC) error {
	for _, dr := range drives {
		path, err := m.lay.expose(dr.Path, "drive-"+dr.ID, !dr.ReadOnly)
		if err != nil {
			return err
		}
		id, ro, root := dr.ID, dr.ReadOnly, false
		// Root selection stays with the caller's command line (root=/dev/vda):
		// drives appear in the order given, as with the QEMU driver.
		if err := m.api.putDrive(ctx, &models.Drive{DriveID: &id, PathOnHost: &path, IsReadOnly: &ro, IsRootDevice: &root}); err != nil {
			return err
		}
		m.meta.Drives = append(m.meta.Drives, snapDrive{ID: dr.ID, Path: dr.Path, VMPath: path, ReadOnly: dr.ReadOnly})
	}
	for _, n := range nics {
		id, tap := n.ID, n.TapName
		if err := m.api.putNIC(ctx, &models.NetworkInterface{IfaceID: &id, HostDevName: &tap, GuestMac: n.MAC}); err != nil {
			return err
		}
		m.meta.NICs = append(m.meta.NICs, snapNIC{ID: n.ID, MAC: n.MAC, TapName: n.TapName})
	}
	return nil
}

// attachExtras adds the balloon and MMDS configured in Options.
func (m *Machine) attachExtras(ctx context.Context) error {
	o := m.d.opts
	if b := o.Balloon; b != nil {
		amount, deflate := b.AmountMiB, b.DeflateOnOOM
		if err := m.api.putBalloon(ctx, &models.Balloon{AmountMib: &amount, DeflateOnOom: &deflate, StatsPollingIntervals: b.StatsPollingIntervalS}); err != nil {
			return err
		}
	}
	if mm := o.MMDS; mm != nil {
		version := mm.Version
		if version == "" {
			version = "V2"
		}
		mc := &models.MmdsConfig{NetworkInterfaces: mm.Interfaces, Version: &version}
		if mm.IPv4Address != "" {
			addr := mm.IPv4Address
			mc.IPV4Address = &addr
		}
		if err := m.api.putMMDSConfig(ctx, mc); err != nil {
			return err
		}
	}
	return nil
}

// bootArgs appends what a Firecracker guest needs unless the caller chose
// otherwise: the serial console, reboot and panic turning into a VMM exit
// (so Wait sees a crashed guest), and no PCI probing (there is no PCI bus).
func bootArgs(cmdline string) string {
	// Words after "--" are the init's arguments, not the kernel's.
	kernel, initArgs, hasInit := strings.Cut(" "+cmdline+" ", " -- ")
	args := strings.Fields(kernel)
	has := func(key string) bool {
		for _, a := range args {
			if a == key || strings.HasPrefix(a, key+"=") {
				return true
			}
		}
		return false
	}
	for _, kv := range []string{"console=ttyS0", "reboot=k", "panic=1", "pci=off"} {
		if key, _, _ := strings.Cut(kv, "="); !has(key) {
			args = append(args, kv)
		}
	}
	if hasInit {
		args = append(append(args, "--"), strings.Fields(initArgs)...)
	}
	return strings.Join(args, " ")
}

// absPaths makes each non-empty path absolute.
func absPaths(paths ...*string) error {
	for _, p := range paths {
		if *p == "" {
			continue
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			return fmt.Errorf("path %s: %w", *p, err)
		}
		*p = abs
	}
	return nil
}
