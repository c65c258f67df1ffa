package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/agentenv/agentenv/internal/atomicfile"

	"github.com/agentenv/agentenv/vmm"
	"golang.org/x/sys/unix"
)

// recordFile in a run directory describes the running machine, so a new
// node process can adopt it after a restart.
const recordFile = "machine.json"

type machineRecord struct {
	ID         string       `json:"id"`
	PID        int          `json:"pid"`
	Binary     string       `json:"binary"`
	Spec       *machineSpec `json:"spec"`
	MemoryPath string       `json:"memoryPath"`
	MemShared  bool         `json:"memoryShared"`
	Console    string       `json:"console"`
	Created    bool         `json:"createdRunDir"`
	Owned      []string     `json:"owned"`
}

func (m *machine) saveRecord() error {
	path := m.rd.path(recordFile)
	m.rd.own(path)
	// The binary QEMU was started from, not /proc/PID/exe: a confined one
	// may still be the jail's helper (this executable) at this point.
	rec := machineRecord{ID: m.id, PID: m.proc.Pid, Binary: m.binary, Spec: m.spec, MemoryPath: m.mem.path,
		MemShared: m.mem.shared, Console: m.rd.console, Created: m.rd.created, Owned: m.rd.owned}
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("machine record: %w", err)
	}
	return nil
}

// Adopt implements vmm.Adopter: it takes over a QEMU started by an earlier
// process of ours from its run directory (the node server restarted while
// its VMs kept running).
func (d *Driver) Adopt(ctx context.Context, dir string) (vmm.Machine, error) {
	b, err := os.ReadFile(filepath.Join(dir, recordFile))
	if err != nil {
		return nil, fmt.Errorf("adopt %s: %w", dir, err)
	}
	var rec machineRecord
	if err := json.Unmarshal(b, &rec); err != nil || rec.Spec == nil || rec.PID <= 0 {
		return nil, fmt.Errorf("adopt %s: bad machine record", dir)
	}
	if !runsBinary(rec.PID, rec.Binary) {
		return nil, fmt.Errorf("adopt %s: process %d is gone: %w", dir, rec.PID, vmm.ErrStopped)
	}
	proc, err := os.FindProcess(rec.PID)
	if err != nil {
		return nil, fmt.Errorf("adopt %s: %w", dir, err)
	}
	pidfd, err := unix.PidfdOpen(rec.PID, 0)
	if err != nil {
		return nil, fmt.Errorf("adopt %s: pidfd: %w", dir, err)
	}
	rd := &runDir{dir: dir, created: rec.Created, console: rec.Console, owned: rec.Owned}
	m := &machine{id: rec.ID, binary: rec.Binary, spec: rec.Spec, mem: memorySource{path: rec.MemoryPath, shared: rec.MemShared}, rd: rd,
		proc: proc, exited: make(chan struct{}), tscKHz: d.tscKHz, log: d.log.With("vm", rec.ID, "pid", rec.PID, "adopted", true)}
	go m.watchPidfd(pidfd)
	m.startConsoleCap()
	if err := m.connect(ctx); err != nil {
		return nil, fmt.Errorf("adopt %s: %w", dir, err)
	}
	m.log.Info("adopted running machine")
	return m, nil
}

// watchPidfd closes exited when a process that is not our child ends.
func (m *machine) watchPidfd(fd int) {
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		_, err := unix.Poll(fds, -1)
		if err == nil || !errors.Is(err, unix.EINTR) {
			break
		}
	}
	m.exitErr = errors.New("adopted process exited")
	close(m.exited)
}

// Detach implements vmm.Detacher: it drops this handle's control
// connection and leaves QEMU running, for a later Adopt.
func (m *machine) Detach() error {
	if err := m.alive(); err != nil {
		return err
	}
	m.stopOnce.Do(func() {}) // this handle must not stop the VM any more
	m.stopConsoleCap()
	return m.qmp.Close()
}

// runsBinary reports whether process pid runs binary (and is not another
// process that took a dead VMM's pid). A jailed QEMU's /proc/PID/exe reads
// relative to the bind mount of its own namespace it was started from
// (/usr bound there shows /usr/bin/qemu-system-x86_64 as
// /bin/qemu-system-x86_64), so the file itself is compared first; a binary
// replaced on disk since the start (a package upgrade) is matched by the
// path the link shows.
func runsBinary(pid int, binary string) bool {
	exe := fmt.Sprintf("/proc/%d/exe", pid)
	var running, onDisk unix.Stat_t
	if unix.Stat(exe, &running) == nil && unix.Stat(binary, &onDisk) == nil &&
		running.Dev == onDisk.Dev && running.Ino == onDisk.Ino {
		return true
	}
	link, err := os.Readlink(exe)
	if err != nil {
		return false
	}
	link = strings.TrimSuffix(link, " (deleted)")
	return link == binary || (strings.HasPrefix(link, "/") && strings.HasSuffix(binary, link))
}
