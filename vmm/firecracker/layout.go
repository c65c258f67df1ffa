package firecracker

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// layout maps between the paths the VMM sees and host paths. Run directly,
// both are the same. Under the jailer the VMM sees only its chroot, so every
// host file it needs is linked (or bind-mounted, across file systems) into
// the chroot under a stable name: a snapshot taken in one chroot then names
// "/drive-rootfs", which every restored chroot provides again, so restored
// machines can use drives at different host paths.
type layout struct {
	runDir    string
	jailed    bool
	chrootDir string // <base>/<exec name>/<id>, removed on cleanup
	root      string // chrootDir/root
	uid, gid  int
	mounts    []string // bind mounts to undo, innermost last
}

var jailerID = regexp.MustCompile(`^[a-zA-Z0-9-]{1,64}$`)

// instanceID turns a vmm machine ID into one Firecracker and its jailer
// accept (letters, digits and '-'). Two IDs differing only in '_' and '-'
// map to the same instance ID; under the jailer the chroot check in
// newLayout refuses the second one.
func instanceID(id string) string { return strings.ReplaceAll(id, "_", "-") }

func newLayout(runDir string, j *JailerOptions, fcBinary, id string) (*layout, error) {
	l := &layout{runDir: runDir}
	if j == nil {
		return l, nil
	}
	if !jailerID.MatchString(id) {
		return nil, fmt.Errorf("jailer: id %q: only letters, digits and '-' are allowed", id)
	}
	if !strings.Contains(filepath.Base(fcBinary), "firecracker") {
		return nil, fmt.Errorf("jailer: executable %s: the jailer only runs files whose name contains \"firecracker\"", fcBinary)
	}
	l.jailed = true
	l.uid, l.gid = j.UID, j.GID
	l.chrootDir = filepath.Join(j.ChrootBase, filepath.Base(fcBinary), id)
	l.root = filepath.Join(l.chrootDir, "root")
	if _, err := os.Lstat(l.chrootDir); err == nil {
		return nil, fmt.Errorf("jailer: chroot %s already exists (another machine with id %q?)", l.chrootDir, id)
	}
	if err := os.MkdirAll(l.root, 0o755); err != nil {
		return nil, fmt.Errorf("jailer: create chroot %s: %w", l.root, err)
	}
	return l, nil
}

// vmPath is the path the VMM uses for a runtime file called name.
func (l *layout) vmPath(name string) string {
	if l.jailed {
		return "/" + name
	}
	return filepath.Join(l.runDir, name)
}

// hostPath is where a runtime file called name lives on the host.
func (l *layout) hostPath(name string) string {
	if l.jailed {
		return filepath.Join(l.root, name)
	}
	return filepath.Join(l.runDir, name)
}

// touch creates an empty runtime file the VMM will write (Firecracker's
// logger and metrics open existing files), owned by the jail user.
func (l *layout) touch(name string) (vm string, err error) {
	host := l.hostPath(name)
	f, err := os.OpenFile(host, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o640)
	if err != nil {
		return "", fmt.Errorf("create %s: %w", host, err)
	}
	_ = f.Close()
	if l.jailed {
		if err := os.Chown(host, l.uid, l.gid); err != nil {
			return "", fmt.Errorf("chown %s: %w", host, err)
		}
	}
	return l.vmPath(name), nil
}

// expose makes the host file src reachable by the VMM as name and returns
// the path to hand to the API.
func (l *layout) expose(src, name string, writable bool) (string, error) {
	if !l.jailed {
		return src, nil
	}
	dst := filepath.Join(l.root, name)
	st, err := os.Stat(src)
	if err != nil {
		return "", fmt.Errorf("jailer: expose %s: %w", src, err)
	}
	switch {
	case st.Mode()&os.ModeDevice != 0:
		if err := l.mknodLike(src, dst, st); err != nil {
			return "", err
		}
	case st.Mode().IsRegular():
		if err := l.linkOrBind(src, dst); err != nil {
			return "", err
		}
	default:
		return "", fmt.Errorf("jailer: expose %s: not a regular file or device", src)
	}
	// Only writable files get the jail's owner: read-only ones are often
	// shared (kernel, memory image) and a hard link would re-own the original.
	if writable {
		if err := os.Chown(dst, l.uid, l.gid); err != nil {
			return "", fmt.Errorf("jailer: chown %s: %w", dst, err)
		}
	} else if !readableBy(st, l.uid, l.gid) {
		return "", fmt.Errorf("jailer: %s (mode %v) is not readable by the jail's uid %d / gid %d", src, st.Mode().Perm(), l.uid, l.gid)
	}
	return "/" + name, nil
}

// readableBy applies the permission bits the jailed VMM will face.
func readableBy(st os.FileInfo, uid, gid int) bool {
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return true
	}
	perm := st.Mode().Perm()
	switch {
	case int(sys.Uid) == uid:
		return perm&0o400 != 0
	case int(sys.Gid) == gid:
		return perm&0o040 != 0
	default:
		return perm&0o004 != 0
	}
}

func (l *layout) mknodLike(src, dst string, st os.FileInfo) error {
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("jailer: expose %s: no device number", src)
	}
	if err := unix.Mknod(dst, sys.Mode, int(sys.Rdev)); err != nil {
		return fmt.Errorf("jailer: mknod %s like %s: %w", dst, src, err)
	}
	return nil
}

func (l *layout) linkOrBind(src, dst string) error {
	err := os.Link(src, dst)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EXDEV) && !errors.Is(err, unix.EPERM) {
		return fmt.Errorf("jailer: link %s into chroot: %w", src, err)
	}
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("jailer: bind target %s: %w", dst, err)
	}
	_ = f.Close()
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("jailer: bind %s into chroot: %w", src, err)
	}
	l.mounts = append(l.mounts, dst)
	return nil
}

// collect moves a file the VMM wrote inside the chroot to dst on the host.
func (l *layout) collect(name, dst string) error {
	if !l.jailed {
		return nil
	}
	src := filepath.Join(l.root, name)
	if err := os.Rename(src, dst); errors.Is(err, unix.EXDEV) {
		if err := copyFile(src, dst); err != nil {
			return err
		}
		if err := os.Remove(src); err != nil {
			return err
		}
	} else if err != nil {
		return fmt.Errorf("move %s to %s: %w", src, dst, err)
	}
	// Snapshot files leave the jail owned by root and readable by the jail
	// group, so machines restored in other jails of that group can map them.
	if err := os.Chown(dst, 0, l.gid); err != nil {
		return fmt.Errorf("chown %s: %w", dst, err)
	}
	return os.Chmod(dst, 0o640)
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("copy to %s: %w", dst, err)
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	return out.Close()
}

// cleanup undoes bind mounts and removes the chroot. The jailer leaves its
// cgroup directories behind; removing them is best effort.
func (l *layout) cleanup(j *JailerOptions, id string) {
	if !l.jailed {
		return
	}
	for i := len(l.mounts) - 1; i >= 0; i-- {
		_ = unix.Unmount(l.mounts[i], unix.MNT_DETACH)
	}
	l.mounts = nil
	_ = os.RemoveAll(l.chrootDir)
	if j != nil {
		parent := j.ParentCgroup
		if parent == "" {
			parent = filepath.Base(filepath.Dir(l.chrootDir))
		}
		_ = os.Remove(filepath.Join("/sys/fs/cgroup", parent, id))
	}
}

// jailerArgs builds the jailer's command line; Firecracker's own arguments
// follow "--".
func jailerArgs(j *JailerOptions, jailerBin, fcBin, id string, fcArgs []string) []string {
	a := []string{jailerBin,
		"--id", id,
		"--exec-file", fcBin,
		"--uid", strconv.Itoa(j.UID),
		"--gid", strconv.Itoa(j.GID),
		"--chroot-base-dir", j.ChrootBase,
	}
	if j.NetNS != "" {
		a = append(a, "--netns", j.NetNS)
	}
	if j.CgroupVersion != 0 {
		a = append(a, "--cgroup-version", strconv.Itoa(j.CgroupVersion))
	}
	if j.ParentCgroup != "" {
		a = append(a, "--parent-cgroup", j.ParentCgroup)
	}
	for _, c := range j.Cgroups {
		a = append(a, "--cgroup", c)
	}
	return append(append(a, "--"), fcArgs...)
}
