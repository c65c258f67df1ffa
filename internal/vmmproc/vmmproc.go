// Package vmmproc finds VMM processes (QEMU, Firecracker) on the host: the
// node's start reaps those no record owns, tests look for a sandbox's. A VMM's command line need not name its sandbox: QEMU is handed its
// run directory's files (QMP socket, console, memory) as descriptors, so a
// process is matched by its command line or by the paths of its open files.
package vmmproc

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Mentioning lists the pids of VMM processes whose command line or open
// files' paths contain s.
func Mentioning(s string) []int {
	var out []int
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		if IsVMM(d) && Mentions(d, s) {
			pid, _ := strconv.Atoi(filepath.Base(d))
			out = append(out, pid)
		}
	}
	return out
}

// IsVMM reports whether the process at /proc/PID dir runs QEMU or Firecracker.
func IsVMM(dir string) bool {
	exe, _ := os.Readlink(filepath.Join(dir, "exe"))
	base := filepath.Base(exe)
	return strings.HasPrefix(base, "qemu-system") || strings.HasPrefix(base, "firecracker")
}

// Mentions reports whether the process at /proc/PID dir names s in its
// command line or in the path of a file it holds open.
func Mentions(dir, s string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "cmdline"))
	if err != nil {
		return false
	}
	if strings.Contains(string(b), s) {
		return true
	}
	fds, _ := os.ReadDir(filepath.Join(dir, "fd"))
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join(dir, "fd", fd.Name())); err == nil && strings.Contains(target, s) {
			return true
		}
	}
	return false
}
