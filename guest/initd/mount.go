package initd

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

type mountSpec struct {
	source, target, fstype string
	flags                  uintptr
	data                   string
}

func mountAll(specs []mountSpec) error {
	for _, m := range specs {
		if err := os.MkdirAll(m.target, 0o755); err != nil {
			return fmt.Errorf("mkdir %s: %w", m.target, err)
		}
		if mounted(m.target) {
			continue
		}
		if err := unix.Mount(m.source, m.target, m.fstype, m.flags, m.data); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s on %s: %w", m.fstype, m.target, err)
		}
	}
	return nil
}

// mounted reports whether path is a mount point (its device differs from its parent's).
func mounted(path string) bool {
	var st, parent unix.Stat_t
	if unix.Stat(path, &st) != nil || unix.Stat(filepath.Dir(path), &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
}

func mountEarly() error {
	const nodev = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	return mountAll([]mountSpec{
		{"devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755"},
		{"proc", "/proc", "proc", nodev, ""},
		{"sysfs", "/sys", "sysfs", nodev, ""},
	})
}

func mountLate() error {
	const nodev = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	if err := mountAll([]mountSpec{
		{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "gid=5,mode=620,ptmxmode=666"},
		{"tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
		{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755"},
		{"tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
		{"cgroup2", "/sys/fs/cgroup", "cgroup2", nodev, ""},
	}); err != nil {
		return err
	}
	// /dev/ptmx must point at the devpts instance for PTYs to work.
	if _, err := os.Lstat("/dev/ptmx"); err != nil {
		_ = os.Symlink("pts/ptmx", "/dev/ptmx")
	}
	for link, target := range map[string]string{"/dev/fd": "/proc/self/fd", "/dev/stdin": "/proc/self/fd/0", "/dev/stdout": "/proc/self/fd/1", "/dev/stderr": "/proc/self/fd/2"} {
		if _, err := os.Lstat(link); err != nil {
			_ = os.Symlink(target, link)
		}
	}
	return nil
}

// switchRoot mounts the real root filesystem, moves the pseudo filesystems
// into it, frees the initramfs and execs the agent from the new root, still
// as PID 1.
func switchRoot(log *slog.Logger, cl *Cmdline) error {
	const newRoot = "/newroot"
	if err := waitForDevice(cl.Root, 10*time.Second); err != nil {
		return err
	}
	if err := os.MkdirAll(newRoot, 0o755); err != nil {
		return fmt.Errorf("mkdir %s: %w", newRoot, err)
	}
	var flags uintptr
	if cl.ReadOnly {
		flags |= unix.MS_RDONLY
	}
	if err := unix.Mount(cl.Root, newRoot, cl.RootFSType, flags, ""); err != nil {
		return fmt.Errorf("mount root %s (%s): %w", cl.Root, cl.RootFSType, err)
	}
	agent := filepath.Join(newRoot, "usr/bin/aenv-agent")
	if _, err := os.Stat(agent); err != nil {
		return fmt.Errorf("root %s has no agent: %w", cl.Root, err)
	}
	for _, dir := range []string{"/dev", "/proc", "/sys"} {
		target := filepath.Join(newRoot, dir)
		_ = os.MkdirAll(target, 0o755)
		if err := unix.Mount(dir, target, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move %s into new root: %w", dir, err)
		}
	}
	freeInitramfs()
	if err := unix.Chdir(newRoot); err != nil {
		return fmt.Errorf("chdir %s: %w", newRoot, err)
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move new root to /: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	_ = unix.Chdir("/")
	log.Info("switched root", "root", cl.Root)
	err := unix.Exec("/usr/bin/aenv-agent", []string{"aenv-agent"}, os.Environ())
	return fmt.Errorf("exec agent from new root: %w", err)
}

// freeInitramfs removes what guest/image put into the initramfs so its
// memory returns to the guest (the initramfs is a tmpfs that cannot be unmounted).
func freeInitramfs() {
	for _, p := range []string{"/init", "/lib", InitramfsMarker} {
		_ = os.RemoveAll(p)
	}
}

func waitForDevice(path string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if _, err := os.Stat(path); err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("root device %s did not appear within %s (is its driver module in the initramfs?)", path, timeout)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
