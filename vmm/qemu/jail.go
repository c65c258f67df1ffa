package qemu

import (
	"fmt"
	"path/filepath"
)

// Confines implements vmm.Confiner: a machine with RunAs runs as that
// identity (QEMU's -runas) in a chroot (-chroot) holding nothing but the
// sockets of its disks, under the seccomp filter every machine gets.
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
