package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/agentenv/agentenv/config"
	"github.com/agentenv/agentenv/internal/cgroup"
)

// hostPaths are the files preflight reads of the machine; tests point them
// at files they make.
type hostPaths struct {
	kvm         string // the KVM device
	ublkControl string // the ublk driver's control device
	fuse        string // the FUSE device (storage.shared_memory = "fuse")
	mountinfo   string // the mount table, for the control group hierarchies
	selfCgroup  string // this process's control groups (sandbox.cgroup_delegated)
}

var realHost = hostPaths{kvm: "/dev/kvm", ublkControl: "/dev/ublk-control", fuse: "/dev/fuse", mountinfo: "/proc/self/mountinfo",
	selfCgroup: "/proc/self/cgroup"}

// preflight refuses, before anything starts, a configuration this host
// cannot serve: one error naming each setting and what the host lacks.
// memoryDevicesSet says storage.memory_devices was set explicitly (its
// default, on, means "where the host can").
func preflight(cfg config.Config, memoryDevicesSet bool, h hostPaths) error {
	var errs []error
	if cfg.VMM.Accel == "kvm" {
		if err := usableDevice(h.kvm); err != nil {
			errs = append(errs, fmt.Errorf("vmm.accel = \"kvm\" needs a usable %s: %w (leave accel empty to detect, or set \"tcg\")", h.kvm, err))
		}
	}
	if cfg.Sandbox.Cgroups {
		hier, err := detectGroups(cfg, h)
		if err == nil {
			err = hier.Writable()
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("sandbox.cgroups = true: %w (delegate a writable hierarchy, or set sandbox.cgroups = false)", err))
		}
	}
	if memoryDevicesSet && cfg.Storage.MemoryDevices {
		switch {
		case cfg.Storage.Backend != "storaged":
			errs = append(errs, fmt.Errorf("storage.memory_devices = true needs storage.backend = \"storaged\" (got %q)", cfg.Storage.Backend))
		case (cfg.Storage.SharedMemory == "fuse" || cfg.Storage.SharedMemory == "auto") && usableDevice(h.fuse) == nil:
		case usableDevice(h.ublkControl) != nil:
			errs = append(errs, fmt.Errorf("storage.memory_devices = true needs the ublk driver, or shared_memory = \"fuse\" with a usable FUSE device: %w (modprobe ublk_drv, set shared_memory, or set memory_devices = false)",
				usableDevice(h.ublkControl)))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("config: this host cannot serve it: %w", errors.Join(errs...))
	}
	return nil
}

// detectGroups finds where the node makes its VMMs' groups: aenv/<network
// prefix> under each hierarchy's root, or under the node's own (delegated)
// group with sandbox.cgroup_delegated.
func detectGroups(cfg config.Config, h hostPaths) (*cgroup.Hierarchy, error) {
	parent := filepath.Join("aenv", cfg.Network.Prefix)
	if cfg.Sandbox.CgroupDelegated {
		return cgroup.Delegated(h.mountinfo, h.selfCgroup, parent)
	}
	return cgroup.DetectIn(h.mountinfo, parent)
}

// usableDevice opens a character device for reading and writing, as its
// user will.
func usableDevice(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("open device %s: %w", path, err)
	}
	if st.Mode()&os.ModeCharDevice == 0 {
		return fmt.Errorf("open device %s: not a character device", path)
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("open device %s: %w", path, err)
	}
	return f.Close()
}
