// Package sandbox brings one VM of the node up and takes it down: the one
// sequence every VM goes through, whether it is a sandbox being created or
// resumed, a fork child, a template's first boot or a build VM.
//
// Start runs named stages in order, in the style of a handler list:
//
//	network  a slot (netns, veth, tap, NAT) and the sandbox's egress policy
//	disk     the root drive from the node's disk backend (Disk.Attach), then
//	         the extra drives (Spec.Drives) in their slots
//	memory   the memory file a restore maps (Spec.Memory; restores only)
//	vmm      the VMM restores the snapshot or cold-boots the kernel; Spec.Started
//	         is told its machine before anything else happens (record its pid)
//	confine  the VMM moves into a control group of its own, named by Spec.ID,
//	         with Spec.Limits (when Deps.Groups is set)
//	agent    wait for the agent's /health, then /init (Spec.Init)
//
// Every stage that acquires something registers its undo on a cleanup stack
// (the tap, the slot, the disk, the VMM); on any failure the stack runs
// once, newest first, so nothing is left running or held. After each stage
// Spec.Stage is called with its name (latency metrics, fault points); an
// error from it aborts the start like a failing stage.
//
// Stop is the tear-down: the VMM, its control group, then the slot. The
// disk stays attached until Detach, so a pause can seal it between the two.
//
// A warm pool runs the same stages in two halves (pooled.go): a start with
// Spec.Prepare stops after confine with a VMM waiting for its state; a
// later start with Spec.Pooled takes that VM's slot, disk, memory image and
// VMM in the same stages instead of acquiring its own, loads the state
// (vmm_restore) and runs the agent stage.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/agentenv/agentenv/internal/cgroup"
	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/vmm"
)

// NICID is the guest network interface every VM gets.
const NICID = "eth0"

// Slots hands out network slots (network.Manager).
type Slots interface {
	Acquire(ctx context.Context) (*network.Slot, error)
	Release(ctx context.Context, s *network.Slot) error
}

// Disk is a VM's root disk on the node's disk backend.
type Disk interface {
	// Attach makes the disk available and returns the VM's drive. as, when
	// set, is the identity the VM's VMM runs as (Deps.Identities): the
	// disk must let it reconnect.
	Attach(ctx context.Context, as *vmm.Identity) (vmm.Drive, error)
	// Detach releases what Attach took (idempotent).
	Detach(ctx context.Context)
}

// Deps are the node's parts a start uses.
type Deps struct {
	Driver vmm.Driver
	Slots  Slots
	// Groups, when set, confines every VMM in a control group of its own
	// (*cgroup.Hierarchy); nil leaves VMMs in the node's group.
	Groups Groups
	// Identities, when set, confines every VMM (the driver must be a
	// vmm.Confiner): it runs as the identity of its network slot, which no
	// other VM holds while it runs. Nil leaves VMMs running as the node.
	Identities func(slot *network.Slot) vmm.Identity
}

// Groups makes and finds control groups by name.
type Groups interface {
	Create(name string, l cgroup.Limits) (*cgroup.Group, error)
	Open(name string) (*cgroup.Group, error)
}

// Spec describes one VM start.
type Spec struct {
	ID     string // the machine's id (the VMM names its process with it)
	RunDir string
	Policy network.Policy // zero: no egress policy beyond the defaults
	Disk   Disk
	// Drives are the machine's drive slots after the root disk (SlotID):
	// a nil entry is an empty slot (vmm.Drive.Empty). A cold boot makes
	// the slots; a restore finds them in the snapshot, which must have as
	// many (see DriveSlots).
	Drives []Disk

	// Restore is the VMM snapshot directory to restore; empty cold-boots Boot.
	Restore string
	// Memory returns the memory image to restore with (see Memory).
	Memory func(ctx context.Context) (Memory, error)
	// Boot configures a cold boot: kernel, initrd, sizes and the kernel
	// command line before the network arguments (drives and NICs are added).
	Boot *vmm.Config

	// AgentWait bounds the wait for the agent (default one minute).
	AgentWait time.Duration
	// Init, when set, is sent to the agent's /init with the token the
	// guest holds (InitHeld).
	Init     *InitRequest
	InitHeld string

	// VCPUs and MemoryMiB size the VMM's control group (Deps.Groups): the
	// guest's, plus the VMM's own share (vmmLimits). A cold boot's default
	// to Boot's.
	VCPUs, MemoryMiB int

	Stage   func(name string) error
	Started func(m vmm.Machine) error
	// Log receives the guest console's tail when the agent stays silent
	// (the run directory, console included, goes with the failed VM).
	Log *slog.Logger

	// Prepare starts the VMM of Restore without loading its state (the
	// driver must be a vmm.Preparer) and ends after confine: the VM waits,
	// holding its slot, disk and memory image, for a start that takes it
	// (Pooled). Memory must return no layers: they are the taker's.
	Prepare bool
	// Pooled is a VM a start with Prepare made, which this start takes
	// whole (the caller must not use it any more): its slot (Policy is set
	// on it), its disk (Disk is what the VM releases from now on, so the
	// caller makes it name the pooled one), its memory image (Memory must
	// return the same file) and its VMM, whose run directory moves to
	// RunDir before Restore's state and Memory's layers are loaded. Drives
	// must all be empty slots: a pooled VM was started with no disk in them.
	Pooled *VM
}

// Memory is the memory image a restore maps.
type Memory struct {
	// File is the file or block device mapped privately ("": the
	// snapshot's own memory file).
	File string
	// Layers are sealed memory layers written over it before the guest
	// runs (vmm.RestoreConfig.MemoryLayers).
	Layers []string
	// Release, when set, gives back what mapping File holds (a shared
	// device of the storage daemon). The VM calls it once its VMM is gone,
	// never while the VMM may still map File.
	Release func(ctx context.Context)
	// Ready, when set, is waited for between the state's load and the
	// guest's first instruction (the vCPUs stay stopped until it
	// returns): the working set of an image whose layers are not on the
	// node is pushed into the page cache meanwhile, so the guest's first
	// faults find it there instead of fetching one page run at a time.
	Ready func(ctx context.Context)
}

// VM is a started VM with what it holds.
type VM struct {
	Machine vmm.Machine
	Slot    *network.Slot
	Memory  string // the memory file it maps ("" for a cold boot or a whole snapshot)
	// EnvdVersion is the protocol version the agent reported at /init
	// ("" without an /init or when it reported none).
	EnvdVersion string

	deps      Deps
	disk      Disk
	drives    []Disk
	group     *cgroup.Group
	memLayers []string                  // written over Memory by the restore
	memReady  func(ctx context.Context) // Memory.Ready
	// memRelease gives back what mapping Memory holds (Memory.Release);
	// called by Stop once the VMM is gone.
	memRelease func(ctx context.Context)
	runAs      *vmm.Identity // the VMM's identity (Deps.Identities); nil: the node's
}

// Start runs the stages; on failure nothing is left running or held.
func Start(ctx context.Context, deps Deps, spec Spec) (_ *VM, err error) {
	v := &VM{deps: deps, disk: spec.Disk, drives: spec.Drives}
	var undo cleanup
	defer func() {
		if err != nil {
			undo.run(context.WithoutCancel(ctx))
		}
	}()
	stage := func(name string) error {
		if spec.Stage == nil {
			return nil
		}
		return spec.Stage(name)
	}
	if err := checkTwoHalves(spec); err != nil {
		if spec.Pooled != nil {
			_ = spec.Pooled.Close(context.WithoutCancel(ctx)) // taken whole, even by a start that refuses it
		}
		return nil, err
	}
	tap, err := v.network(ctx, spec, &undo)
	if err != nil {
		return nil, err
	}
	if tap != nil {
		defer tap.Close() // the VMM holds its own descriptor once it runs
	}
	if err := stage("network"); err != nil {
		return nil, err
	}
	if v.deps.Identities != nil {
		id := v.deps.Identities(v.Slot)
		v.runAs = &id
	}
	drives, err := v.storage(ctx, spec, &undo)
	if err != nil {
		return nil, err
	}
	if err := stage("storage"); err != nil {
		return nil, err
	}
	if spec.Memory != nil {
		if err := v.memory(ctx, spec, &undo); err != nil {
			return nil, err
		}
		if err := stage("memory"); err != nil {
			return nil, err
		}
	}
	if v.Machine, err = v.vmm(ctx, spec, drives, tap); err != nil {
		return nil, err
	}
	undo.add(func(ctx context.Context) { _ = v.Machine.Stop(ctx) })
	if spec.Started != nil {
		if err := spec.Started(v.Machine); err != nil {
			return nil, err
		}
	}
	if err := stage("vmm_restore"); err != nil {
		return nil, err
	}
	if err := v.confine(spec, &undo); err != nil {
		return nil, err
	}
	if spec.Prepare {
		return v, nil
	}
	if err := v.agent(ctx, spec); err != nil {
		return nil, err
	}
	if err := stage("agent"); err != nil {
		return nil, err
	}
	return v, nil
}

// network acquires a slot (or takes the pooled VM's), sets the policy and
// opens the tap (a pooled VM's VMM holds its own: nil).
func (v *VM) network(ctx context.Context, spec Spec, undo *cleanup) (*os.File, error) {
	slot := v.pooledSlot(spec)
	if slot == nil {
		var err error
		if slot, err = v.deps.Slots.Acquire(ctx); err != nil {
			return nil, fmt.Errorf("network slot: %w", err)
		}
	}
	undo.add(func(ctx context.Context) { _ = v.deps.Slots.Release(ctx, slot) })
	v.Slot = slot
	v.undoPooled(spec, undo) // its VMM stops before its slot goes back
	if !isZeroPolicy(spec.Policy) {
		if err := slot.SetPolicy(ctx, spec.Policy); err != nil {
			return nil, fmt.Errorf("network policy: %w", err)
		}
	}
	if spec.Pooled != nil {
		return nil, nil
	}
	tap, err := slot.OpenTap()
	if err != nil {
		return nil, fmt.Errorf("tap: %w", err)
	}
	return tap, nil
}

func isZeroPolicy(p network.Policy) bool {
	return !p.DenyInternet && len(p.AllowOut) == 0 && len(p.DenyOut) == 0
}

// storage attaches the root disk and the extra drives (a pooled VM's
// disk is attached already) and returns the VM's drives.
func (v *VM) storage(ctx context.Context, spec Spec, undo *cleanup) ([]vmm.Drive, error) {
	if spec.Pooled != nil {
		undo.add(spec.Disk.Detach)
		return nil, nil
	}
	drive, err := spec.Disk.Attach(ctx, v.runAs)
	if err != nil {
		return nil, err
	}
	undo.add(spec.Disk.Detach)
	drives, err := attachDrives(ctx, spec.Drives, v.runAs, undo)
	if err != nil {
		return nil, err
	}
	return append([]vmm.Drive{drive}, drives...), nil
}

// memory resolves the memory image the restore maps and the layers it
// writes over it.
func (v *VM) memory(ctx context.Context, spec Spec, undo *cleanup) error {
	m, err := spec.Memory(ctx)
	if err != nil {
		return err
	}
	v.Memory, v.memLayers, v.memReady = m.File, m.Layers, m.Ready
	v.HoldMemory(m.Release)
	if spec.Pooled != nil {
		// The pooled VM's hold on the same image goes with its VMM.
		v.HoldMemory(spec.Pooled.memRelease)
		spec.Pooled.memRelease = nil
	}
	// Registered before the VMM's stop, so a failed start stops the VMM
	// first (the undo stack runs newest first).
	undo.add(v.releaseMemory)
	return v.checkPooledMemory(spec)
}

// HoldMemory adds release to what the VM gives back once its VMM is gone
// (a VM adopted after a restart gets its memory image's hold back so).
func (v *VM) HoldMemory(release func(ctx context.Context)) {
	if release == nil {
		return
	}
	if prev := v.memRelease; prev != nil {
		v.memRelease = func(ctx context.Context) { prev(ctx); release(ctx) }
		return
	}
	v.memRelease = release
}

// releaseMemory gives back the memory image's holds (once).
func (v *VM) releaseMemory(ctx context.Context) {
	if r := v.memRelease; r != nil {
		v.memRelease = nil
		r(ctx)
	}
}

// vmm restores the snapshot or cold-boots the kernel; a start with Prepare
// or Pooled does its half of a restore (pooled.go).
func (v *VM) vmm(ctx context.Context, spec Spec, drives []vmm.Drive, tap *os.File) (vmm.Machine, error) {
	if spec.Pooled != nil {
		return v.loadPooled(ctx, spec)
	}
	// Both forms of the tap: the open descriptor (QEMU inherits it) and its
	// name in the slot's namespace (Firecracker opens it there).
	nic := vmm.NIC{ID: NICID, MAC: v.Slot.Guest().MAC.String(), Tap: tap, TapName: network.TapName}
	netns := v.Slot.NetNSPath()
	if spec.Restore != "" {
		rc := vmm.RestoreConfig{
			ID: spec.ID, SnapshotDir: spec.Restore, MemoryFile: v.Memory, MemoryLayers: v.memLayers, RunDir: spec.RunDir,
			Drives: drives, NICs: []vmm.NIC{nic}, NetNS: netns, RunAs: v.runAs,
		}
		if spec.Prepare {
			return v.prepare(ctx, rc)
		}
		rc.Paused = v.memReady != nil
		m, err := v.deps.Driver.Restore(ctx, rc)
		if err != nil {
			return nil, fmt.Errorf("restore: %w", err)
		}
		return v.runWhenReady(ctx, m)
	}
	if spec.Boot == nil {
		return nil, errors.New("start: neither a snapshot to restore nor a boot configuration")
	}
	cfg := *spec.Boot
	g := v.Slot.Guest()
	cfg.ID, cfg.RunDir, cfg.NetNS = spec.ID, spec.RunDir, netns
	cfg.Cmdline = strings.TrimSpace(fmt.Sprintf("%s %s aenv.dns=%s", cfg.Cmdline, g.KernelIPArg(), g.Nameserver))
	cfg.Drives, cfg.NICs, cfg.RunAs = drives, []vmm.NIC{nic}, v.runAs
	m, err := v.deps.Driver.Boot(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("boot: %w", err)
	}
	return m, nil
}

// runWhenReady starts the vCPUs of m, restored with them stopped, once
// the memory is ready (nothing to do without Memory.Ready: m runs). A
// failure stops m: the caller has no undo for it yet.
func (v *VM) runWhenReady(ctx context.Context, m vmm.Machine) (vmm.Machine, error) {
	if v.memReady == nil {
		return m, nil
	}
	v.memReady(ctx)
	if err := m.Resume(ctx); err != nil {
		_ = m.Stop(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("restore: run the vcpus: %w", err)
	}
	return m, nil
}

// confine moves the VMM into its control group.
func (v *VM) confine(spec Spec, undo *cleanup) error {
	if v.deps.Groups == nil {
		return nil
	}
	vcpus, mem := spec.VCPUs, spec.MemoryMiB
	if spec.Boot != nil && vcpus == 0 && mem == 0 {
		vcpus, mem = spec.Boot.VCPUs, spec.Boot.MemoryMiB
	}
	g, err := v.deps.Groups.Create(GroupName(spec.ID), vmmLimits(vcpus, mem, v.Machine.Info().Accel))
	if err != nil {
		return fmt.Errorf("confine vmm: %w", err)
	}
	undo.add(func(context.Context) { _ = g.Remove() })
	v.group = g
	if err := g.Add(v.Machine.Info().PID); err != nil {
		return fmt.Errorf("confine vmm: %w", err)
	}
	return v.leavePooledGroup(spec)
}

// VMMOverheadMiB is the memory a VMM under accel ("kvm", "tcg") may use
// besides its guest's RAM: 256 MiB for its own code, buffers and device
// state, and under TCG its translation cache (vmm.TCGTranslationCacheMiB)
// on top. The VMM's control group allows that much and the node's
// admission counts it for every sandbox, so the limits add up to what the
// host can hold.
func VMMOverheadMiB(accel string) int {
	if accel == "tcg" {
		return 256 + vmm.TCGTranslationCacheMiB
	}
	return 256
}

// vmmLimits bounds a VMM running a guest of vcpus and memMiB: the guest's
// CPUs and RAM plus what the VMM needs of its own (VMMOverheadMiB), and
// half a CPU for its emulator threads. Pids bound threads (vCPUs, I/O
// workers) and forks, which a VMM never needs many of.
func vmmLimits(vcpus, memMiB int, accel string) cgroup.Limits {
	overhead := int64(VMMOverheadMiB(accel))
	l := cgroup.Limits{Pids: 512}
	if vcpus > 0 {
		l.CPUs = float64(vcpus) + 0.5
	}
	if memMiB > 0 {
		l.MemoryBytes = (int64(memMiB) + overhead) << 20
	}
	return l
}

// agent waits for the guest's agent and initialises it.
func (v *VM) agent(ctx context.Context, spec Spec) error {
	wait := spec.AgentWait
	if wait == 0 {
		wait = time.Minute
	}
	start := time.Now()
	attempts, err := waitAgent(ctx, v.Slot, wait)
	if err != nil {
		console, _ := os.ReadFile(v.Machine.Info().ConsoleLog)
		if spec.Log != nil {
			spec.Log.Error("the guest's agent is silent", "vm", spec.ID, "console_tail", string(tail(console, 4000)))
		}
		return fmt.Errorf("%w (guest console: %s)", err, strings.TrimSpace(string(tail(console, 600))))
	}
	health := time.Since(start)
	if spec.Init != nil {
		req := *spec.Init
		req.HostTSCkHz = v.Machine.Info().TSCkHz // every start: boot, restore, pooled
		v.EnvdVersion, err = InitAgentVersion(ctx, v.Slot, spec.InitHeld, req)
	}
	if spec.Log != nil {
		// Where the agent stage's time goes: the guest answering at all,
		// then its /init.
		spec.Log.Info("agent ready", "vm", spec.ID, "health_after", health.Round(time.Millisecond),
			"health_requests", attempts, "init_took", (time.Since(start) - health).Round(time.Millisecond))
	}
	return err
}

// Stop stops the VMM, then gives back its memory image's hold and releases
// the slot (its tap is gone with the VMM). The disk stays attached: Detach
// releases it.
func (v *VM) Stop(ctx context.Context) error {
	ctx = context.WithoutCancel(ctx)
	var err error
	if v.Machine != nil {
		if serr := v.Machine.Stop(ctx); serr != nil {
			err = fmt.Errorf("stop vm: %w", serr)
		}
		v.Machine = nil
	}
	if err == nil {
		// A VMM that did not stop may still map its memory image: its hold
		// stays (the node's next start releases holds no VM has).
		v.releaseMemory(ctx)
	}
	if v.group != nil {
		if gerr := v.group.Remove(); gerr != nil {
			err = errors.Join(err, gerr)
		}
		v.group = nil
	}
	if v.Slot != nil {
		if rerr := v.deps.Slots.Release(ctx, v.Slot); rerr != nil {
			err = errors.Join(err, fmt.Errorf("release slot: %w", rerr))
		}
		v.Slot = nil
	}
	return err
}

// Detach releases the disk and the extra drives.
func (v *VM) Detach(ctx context.Context) {
	ctx = context.WithoutCancel(ctx)
	if v.disk != nil {
		v.disk.Detach(ctx)
	}
	for _, d := range v.drives {
		if d != nil {
			d.Detach(ctx)
		}
	}
}

// Close is Stop then Detach.
func (v *VM) Close(ctx context.Context) error {
	err := v.Stop(ctx)
	v.Detach(ctx)
	return err
}

// cleanup is an undo stack: every acquired resource registers how to give
// it back, and run gives them back once, newest first.
type cleanup struct {
	fns []func(context.Context)
}

func (c *cleanup) add(f func(context.Context)) { c.fns = append(c.fns, f) }

func (c *cleanup) run(ctx context.Context) {
	for i := len(c.fns) - 1; i >= 0; i-- {
		c.fns[i](ctx)
	}
	c.fns = nil
}

// tail returns the last n bytes of b.
func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// Adopt wraps a VM a previous node process started (taken over after a
// restart) with its slot, disk and control group (GroupName(id)), so it stops
// like any other.
func Adopt(deps Deps, id string, m vmm.Machine, slot *network.Slot, disk Disk, drives []Disk) *VM {
	v := &VM{deps: deps, Machine: m, Slot: slot, disk: disk, drives: drives}
	if deps.Groups != nil {
		var err error
		if v.group, err = deps.Groups.Open(GroupName(id)); err != nil {
			v.group, _ = deps.Groups.Open(id) // started by a node that named groups by id
		}
	}
	return v
}
