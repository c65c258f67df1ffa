package qemu

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/agentenv/agentenv/internal/vmmjail"
	"github.com/agentenv/agentenv/vmm"
)

// Confines implements vmm.Confiner: a machine with RunAs starts in a mount
// namespace holding only what QEMU needs (internal/vmmjail: the system's
// program directories, its kernel, initrd and drive files, its sockets'
// directory), then runs as that identity (QEMU's -runas) in a chroot
// (-chroot) holding nothing but the sockets of its disks, under the seccomp
// filter every machine gets.
func (d *Driver) Confines() bool { return true }

// jailOf returns the directory a confined machine chroots into: the one
// directory its drives' NBD sockets lie in (after a restart of the storage
// daemon QEMU reconnects to them from inside the jail, as the unprivileged
// identity the sockets are made for), or its run directory when it has no
// NBD drive. Everything else QEMU opens before it drops privileges, so the
// other paths must not depend on its working directory (the jail).
func jailOf(spec *machineSpec, runDir string, others ...string) (string, error) {
	jail := ""
	for _, d := range spec.Drives {
		if d.NBD == nil {
			continue
		}
		dir := filepath.Dir(d.NBD.Socket)
		if jail != "" && dir != jail {
			return "", fmt.Errorf("confine: drive sockets lie in %s and %s: a jail holds one directory", jail, dir)
		}
		jail = dir
	}
	if jail == "" {
		jail = runDir
	}
	for _, p := range append(append([]string{jail, spec.Kernel, spec.Initrd, runDir}, others...), drivePaths(spec)...) {
		if p != "" && !filepath.IsAbs(p) {
			return "", fmt.Errorf("confine: path %q is relative: a confined VMM starts in its jail", p)
		}
	}
	return jail, nil
}

func drivePaths(spec *machineSpec) []string {
	var out []string
	for _, d := range spec.Drives {
		out = append(out, d.Path)
	}
	return out
}

// command returns the QEMU command of a start: plain when the machine is
// not confined (jail ""), else in a jail of its own (internal/vmmjail)
// whose tree holds the files QEMU opens before it drops privileges (kernel,
// initrd, drive files) and the jail directory it chroots into after, at the
// paths the command line names. Its memory file, console, QMP socket and
// taps come as descriptors and need no path.
func (d *Driver) command(spec *machineSpec, args []string, jail string) (*exec.Cmd, error) {
	if jail == "" {
		return exec.Command(d.binary, args...), nil
	}
	binds := []vmmjail.Bind{{Path: jail}, {Path: d.binary}, {Path: spec.Kernel}}
	if spec.Initrd != "" {
		binds = append(binds, vmmjail.Bind{Path: spec.Initrd})
	}
	for _, dr := range spec.Drives {
		if dr.Path != "" {
			binds = append(binds, vmmjail.Bind{Path: dr.Path, Writable: !dr.ReadOnly})
		}
	}
	cmd, err := vmmjail.Command(vmmjail.Spec{
		Path: d.binary, Args: append([]string{d.binary}, args...), Env: os.Environ(), Dir: jail, Binds: binds,
		OwnNetwork: true, // its taps arrive as descriptors; nothing else of the network is its business
	})
	if err != nil {
		return nil, fmt.Errorf("confine: %w", err)
	}
	cmd.Dir = jail // the relative socket paths resolve the same before and after the chroot
	return cmd, nil
}

var _ vmm.Confiner = (*Driver)(nil)
