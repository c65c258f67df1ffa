package qemu

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/agentenv/agentenv/vmm"
)

// machineSpec is everything that must be identical between the QEMU that
// wrote a snapshot and the one restoring it; it is saved as config.json.
type machineSpec struct {
	Version   int         `json:"version"`
	Kernel    string      `json:"kernel"`
	Initrd    string      `json:"initrd,omitempty"`
	Cmdline   string      `json:"cmdline"`
	VCPUs     int         `json:"vcpus"`
	MemoryMiB int         `json:"memoryMiB"`
	Accel     string      `json:"accel"`
	Drives    []vmm.Drive `json:"drives"`
	NICs      []savedNIC  `json:"nics"`
	// NoMemory marks a snapshot written by SnapshotDevices: its directory
	// holds no memory image, so a restore must name one.
	NoMemory bool `json:"noMemory,omitempty"`
	// RunAs confines the process (vmm.Config.RunAs); a restore sets its own.
	RunAs *vmm.Identity `json:"runAs,omitempty"`
	// CPU is the -cpu model when not the accelerator's default (max under
	// TCG, host under KVM), and TCG extra properties of -accel tcg (say
	// "thread=single"): a restore must run the model and the emulation the
	// snapshot was taken with, so both travel with it. Only the restore
	// torture test sets them (Driver.tune), to compare panic rates.
	CPU string `json:"cpu,omitempty"`
	TCG string `json:"tcg,omitempty"`
}

type savedNIC struct {
	ID  string `json:"id"`
	MAC string `json:"mac"`
}

// specVersion 2 machines run with QEMU's migration configuration section
// and trailing self-description off, so their state streams carry neither:
// a device-only state (SnapshotDevices, which never has them) and a full
// stream load the same way. Version 1 snapshots (streams with both) still
// restore, on a machine that expects them.
//
// specVersion 3 machines also have a virtio-balloon device (memory resize,
// balloon.go). A snapshot's device set must match the machine restoring
// it, so a version 2 snapshot restores on a machine without one.
const specVersion = 3

// minSpecVersion is the oldest snapshot config a restore accepts.
const minSpecVersion = 1

// seccompPolicy is QEMU's own seccomp filter: on, with the optional groups
// of system calls a VMM of ours never needs denied (obsolete ones, setuid
// and friends, fork/exec, scheduler and resource controls). A guest that
// escapes into the VMM finds them refused.
const seccompPolicy = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"

// confinedSeccompPolicy is the policy of a VMM that drops to an unprivileged
// identity itself (-runas): QEMU's drop is a set*id call the filter is
// installed before, so those calls stay allowed. They gain nothing after it:
// the process then holds no capability and runs with no_new_privs.
const confinedSeccompPolicy = "on,obsolete=deny,elevateprivileges=allow,spawn=deny,resourcecontrol=deny"

// guestRAMBlock is the id of the memory backend holding guest RAM, which is
// also its RAM block's idstr in the migration stream.
const guestRAMBlock = "mem"

// memorySource says how guest RAM is backed.
type memorySource struct {
	path   string
	shared bool // share=on: guest writes land in the file (cold boot); off: private copy on write (restore)
}

// buildArgs renders the QEMU command line. Taps are passed as inherited
// descriptors starting at fd 3 (ExtraFiles), in NIC order: virtio-mmio has no
// hotplug, so devices must exist when QEMU starts. A confined machine
// (spec.RunAs) chroots into jail, so the NBD sockets it may reconnect to
// after the drop are named relative to it (QEMU starts in jail).
// The QMP socket, console log and memory file come as descriptors (fds,
// see handedFiles).
func buildArgs(spec *machineSpec, mem memorySource, fds argFDs, jail string, incoming bool) []string {
	cpu := "max"
	if spec.Accel == "kvm" {
		cpu = "host"
	}
	if spec.CPU != "" {
		cpu = spec.CPU
	}
	share := "off"
	if mem.shared {
		share = "on"
	}
	policy := seccompPolicy
	if spec.RunAs != nil {
		policy = confinedSeccompPolicy
	}
	machine := "microvm,pit=on,pic=off,isa-serial=on,rtc=on,memory-backend=" + guestRAMBlock
	if spec.Version >= 2 {
		machine += ",suppress-vmdesc=on"
	}
	args := []string{
		// debug-threads names the vCPU threads "CPU n/TCG" or "CPU n/KVM"
		// (top -H, /proc/PID/task/TID/comm), the threads a pin applies to.
		"-name", "aenv,debug-threads=on",
		"-M", machine,
		"-accel", accelArg(spec.Accel, spec.TCG),
		"-cpu", cpu,
		"-smp", fmt.Sprint(spec.VCPUs),
		"-m", fmt.Sprintf("%dM", spec.MemoryMiB),
		"-object", fmt.Sprintf("memory-backend-file,id=%s,size=%dM,mem-path=%s,share=%s,prealloc=off", guestRAMBlock, spec.MemoryMiB, procFD(fds.Memory), share),
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
		"-sandbox", policy,
		"-kernel", spec.Kernel,
		"-append", spec.Cmdline,
		"-chardev", "file,id=console,append=on,path=" + procFD(fds.Console),
		"-serial", "chardev:console",
		"-chardev", fmt.Sprintf("socket,id=qmp,fd=%d,server=on,wait=off", fds.QMP),
		"-mon", "chardev=qmp,mode=control",
		"-device", "virtio-rng-device",
	}
	if spec.Initrd != "" {
		args = append(args, "-initrd", spec.Initrd)
	}
	if spec.RunAs != nil {
		// Both take effect just before the guest first runs: every file
		// above is open by then.
		args = append(args, "-runas", fmt.Sprintf("%d:%d", spec.RunAs.UID, spec.RunAs.GID), "-chroot", jail)
	}
	for _, d := range spec.Drives {
		args = append(args, "-blockdev", blockdev(d, jail), "-device", "virtio-blk-device,werror=report,rerror=report,drive="+d.ID)
	}
	for i, n := range spec.NICs {
		args = append(args,
			"-netdev", fmt.Sprintf("tap,id=%s,fd=%d,vhost=off", n.ID, 3+i),
			"-device", fmt.Sprintf("virtio-net-device,netdev=%s,mac=%s", n.ID, n.MAC))
	}
	if spec.Version >= 2 {
		args = append(args, "-global", "migration.send-configuration=off")
	}
	if spec.Version >= 3 {
		args = append(args, "-device", balloonDevice)
	}
	if incoming {
		args = append(args, "-incoming", "defer", "-S")
	}
	return args
}

// nbdReconnectDelaySeconds is how long an NBD drive's requests wait for a
// lost export to come back.
const nbdReconnectDelaySeconds = 30

func blockdev(d vmm.Drive, jail string) string {
	ro := "off"
	if d.ReadOnly {
		ro = "on"
	}
	if d.Empty {
		// A slot: QEMU's null driver at size zero, writable so a restore can
		// put a writable disk in its place (the guest negotiated the
		// drive's features, read-only among them, when it probed the slot).
		return fmt.Sprintf("driver=null-co,node-name=%s,size=0,read-only=off", d.ID)
	}
	if d.NBD != nil {
		// reconnect-delay keeps the disk through a restart of the storage
		// daemon: requests wait for the export to come back instead of failing.
		sock := d.NBD.Socket
		if jail != "" {
			sock = filepath.Base(sock) // jailSockets checked it lies in jail
		}
		s := fmt.Sprintf("driver=nbd,node-name=%s,server.type=unix,server.path=%s,read-only=%s,reconnect-delay=%d",
			d.ID, escapeOpt(sock), ro, nbdReconnectDelaySeconds)
		if d.NBD.Export != "" {
			s += ",export=" + escapeOpt(d.NBD.Export)
		}
		return s + discard(d)
	}
	driver := "file"
	if st, err := os.Stat(d.Path); err == nil && st.Mode()&os.ModeDevice != 0 {
		driver = "host_device"
	}
	return fmt.Sprintf("driver=%s,node-name=%s,filename=%s,read-only=%s,cache.direct=off", driver, d.ID, escapeOpt(d.Path), ro) + discard(d)
}

// discard passes a writable drive's discards (the guest's TRIM, which
// virtio-blk offers by default) down to its storage: NBD TRIM, which the
// storage daemon turns into holes punched in the disk's upper, or a hole
// in a file. QEMU's default (discard=ignore) drops them, and a guest's
// deleted files would keep their space on the host until the sandbox ends.
func discard(d vmm.Drive) string {
	if d.ReadOnly {
		return ""
	}
	return ",discard=unmap"
}

// escapeOpt doubles commas, QEMU's escape inside option values.
func escapeOpt(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// kernelCmdline appends what the driver needs to the caller's command line.
func kernelCmdline(user, accel string, tscKHz int) string {
	parts := []string{}
	if !strings.Contains(user, "console=") {
		parts = append(parts, "console=ttyS0")
	}
	parts = append(parts, "reboot=t", "panic=-1")
	if user != "" {
		parts = append(parts, user)
	}
	if accel == "tcg" && tscKHz > 0 && !strings.Contains(user, "tsc_early_khz=") {
		// Without it the TSC calibration under TCG hangs a share of boots.
		parts = append(parts, fmt.Sprintf("tsc_early_khz=%d", tscKHz))
	}
	return strings.Join(parts, " ")
}

// accelArg is QEMU's -accel value: under TCG with the translation cache
// bounded (vmm.TCGTranslationCacheMiB), which the node's memory accounting
// counts on, and the extra TCG properties tcg (later ones win, so a
// tb-size there replaces the default).
func accelArg(accel, tcg string) string {
	if accel == "tcg" {
		s := fmt.Sprintf("tcg,tb-size=%d", vmm.TCGTranslationCacheMiB)
		if tcg != "" {
			s += "," + tcg
		}
		return s
	}
	return accel
}
