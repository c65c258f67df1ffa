package network

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// tunGetDevNetNS is TUNGETDEVNETNS (_IO('T', 227), Linux 5.2): an fd of the
// network namespace a tun file's device lives in.
const tunGetDevNetNS = 0x54e3

// tapHolders names the processes holding a tun file attached to the slot's
// tap, as "pid (command, cgroup)": every slot's tap has the same name, so
// each candidate's descriptor is borrowed (pidfd_getfd) and its device's
// namespace compared with the slot's. Candidates whose namespace cannot
// be read are listed as "maybe". For an error message only: it reads /proc.
func (s *Slot) tapHolders() string {
	var st unix.Stat_t
	if err := unix.Fstat(int(s.ns), &st); err != nil {
		return "unknown (" + err.Error() + ")"
	}
	var out []string
	fdinfos, _ := filepath.Glob("/proc/[0-9]*/fdinfo/*")
	for _, f := range fdinfos {
		b, err := os.ReadFile(f)
		if err != nil || !strings.Contains(string(b), "iff:\t"+TapName+"\n") {
			continue
		}
		parts := strings.Split(f, "/")
		pid, _ := strconv.Atoi(parts[2])
		fd, _ := strconv.Atoi(parts[4])
		same, err := tunInNS(pid, fd, st)
		if err == nil && !same {
			continue
		}
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		desc := fmt.Sprintf("%d (%s, fd %d, cgroup %s)", pid, strings.TrimSpace(string(comm)), fd, cgroupOf(pid))
		if err != nil {
			desc = "maybe " + desc + ": " + err.Error()
		}
		out = append(out, desc)
	}
	if len(out) == 0 {
		return "none found"
	}
	return strings.Join(out, "; ")
}

// tunInNS reports whether pid's descriptor fd is a tun file whose device
// is in the namespace st describes.
func tunInNS(pid, fd int, st unix.Stat_t) (bool, error) {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return false, fmt.Errorf("pidfd_open: %w", err)
	}
	defer unix.Close(pidfd)
	dup, err := unix.PidfdGetfd(pidfd, fd, 0)
	if err != nil {
		return false, fmt.Errorf("pidfd_getfd: %w", err)
	}
	defer unix.Close(dup)
	nsfd, err := unix.IoctlRetInt(dup, tunGetDevNetNS)
	if err != nil {
		return false, fmt.Errorf("TUNGETDEVNETNS: %w", err)
	}
	defer unix.Close(nsfd)
	var ns unix.Stat_t
	if err := unix.Fstat(nsfd, &ns); err != nil {
		return false, err
	}
	return ns.Dev == st.Dev && ns.Ino == st.Ino, nil
}

// cgroupOf is the distinct non-root cgroup paths of pid (a VMM's name the
// sandbox it runs), "/" when there is none.
func cgroupOf(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	var paths []string
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		if _, path, ok := strings.Cut(line[strings.IndexByte(line, ':')+1:], ":"); ok && path != "/" && !slices.Contains(paths, path) {
			paths = append(paths, path)
		}
	}
	if len(paths) == 0 {
		return "/"
	}
	return strings.Join(paths, ",")
}
