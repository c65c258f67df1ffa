package vmmtest

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
)

// NamespaceMounts lists the mount points of the mount namespace process pid
// runs in, as seen from that namespace's root (nsenter enters it; a jailed
// VMM's namespace has /usr, so its cat runs there).
func NamespaceMounts(pid int) ([]string, error) {
	out, err := exec.Command("nsenter", "-t", fmt.Sprint(pid), "-m", "cat", "/proc/self/mountinfo").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("read the mount table of %d's namespace: %v: %s", pid, err, out)
	}
	var mounts []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(line); len(f) > 4 {
			mounts = append(mounts, f[4])
		}
	}
	return mounts, nil
}

// JailMountsExtra reports the mount points in mounts that a jailed VMM's
// namespace should not have: anything but its root, /proc, the system's
// program directories, device nodes and the paths in given.
func JailMountsExtra(mounts []string, given ...string) (extra []string) {
	for _, m := range mounts {
		switch {
		case m == "/" || m == "/proc" || m == "/etc/ld.so.cache" || strings.HasPrefix(m, "/dev/"):
		case m == "/usr" || strings.HasPrefix(m, "/usr/") || m == "/lib" || m == "/lib64" || m == "/bin" || m == "/sbin":
		case slices.Contains(given, m):
		default:
			extra = append(extra, m)
		}
	}
	return extra
}

// NetworkAlone reports, as an error, how the network namespace process pid
// runs in is not one of its own holding nothing but a loopback device: the
// namespace is this process's (the host's, for a test), or it has another
// interface (/proc/PID/net/dev lists those of pid's namespace).
func NetworkAlone(pid int) error {
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", pid))
	if err != nil {
		return err
	}
	if own, err := os.Readlink("/proc/self/ns/net"); err != nil || ns == own {
		return fmt.Errorf("process %d runs in the network namespace %s of its starter (%v)", pid, ns, err)
	}
	dev, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/dev", pid))
	if err != nil {
		return err
	}
	var ifaces []string
	for _, line := range strings.Split(string(dev), "\n") {
		if name, _, ok := strings.Cut(line, ":"); ok {
			ifaces = append(ifaces, strings.TrimSpace(name))
		}
	}
	if !slices.Equal(ifaces, []string{"lo"}) {
		return fmt.Errorf("process %d's network namespace %s has interfaces %v, want only lo", pid, ns, ifaces)
	}
	return nil
}
