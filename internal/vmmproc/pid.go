package vmmproc

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// A VMM process is identified by its pid and its start time (field 22 of
// /proc/PID/stat, in clock ticks since boot): a pid alone may have been
// reused by an unrelated process after a crash.

// Start returns the start time of pid, 0 if it does not exist.
func Start(pid int) uint64 {
	if pid <= 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 { // fields 3.. : start time is the 20th of them
		return 0
	}
	v, _ := strconv.ParseUint(f[19], 10, 64)
	return v
}

// Same reports whether pid still names the process that started at start.
func Same(pid int, start uint64) bool {
	return pid > 0 && start != 0 && Start(pid) == start
}

// Under lists the VMM processes (QEMU or Firecracker) whose command
// line names a path under dir, or that hold a file under dir open (QEMU is
// handed its run directory's files as descriptors), by pid.
func Under(dir string) map[int]string {
	out := map[int]string{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	needle := filepath.Clean(dir) + "/"
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		proc := fmt.Sprintf("/proc/%d", pid)
		if !IsVMM(proc) || !Mentions(proc, needle) {
			continue
		}
		cmdline, err := os.ReadFile(proc + "/cmdline")
		if err != nil {
			continue
		}
		out[pid] = string(bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}))
	}
	return out
}

// ReapOrphans kills every VMM process under dir that owned does not list,
// and logs each: after a crash, a VMM no record owns (a create or a build
// interrupted before its pid was recorded) would otherwise run forever.
func ReapOrphans(dir string, owned map[int]bool, log *slog.Logger) int {
	n := 0
	for pid, cmd := range Under(dir) {
		if owned[pid] {
			continue
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			log.Warn("kill orphaned VMM process", "pid", pid, "err", err)
			continue
		}
		n++
		log.Warn("killed a VMM process no sandbox owns", "pid", pid, "cmdline", truncate(cmd, 300))
	}
	return n
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// Kill kills pid if it still names the process that started at start (a
// VMM a crash left running); a reused pid is left alone.
func Kill(pid int, start uint64) {
	if Same(pid, start) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}
