// Command laneinit is PID 1 of a kernel-lane guest (see package kernellane):
// it moves the root off the initramfs, mounts the kernel file systems, loads the modules listed in
// /lane/config.json, runs the test binary with the arguments given there,
// prints the exit marker the host waits for and powers the machine off.
// It is built statically (CGO_ENABLED=0) and knows nothing but that file.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// config mirrors kernellane's guestConfig; the two are kept in step by the
// lane's own test, which boots this init.
type config struct {
	Modules []string `json:"modules"` // module files, dependencies first
	Argv    []string `json:"argv"`
	Env     []string `json:"env"`
	Dir     string   `json:"dir"`
}

// marker is what the host scans for; it must match kernellane.exitMarker.
const marker = "AENV-LANE-EXIT"

func main() {
	code := run()
	fmt.Printf("\n%s %d\n", marker, code)
	unix.Sync()
	// With -no-reboot QEMU exits on the reset; a power-off needs ACPI the
	// microvm machine may lack, a reset works on every machine.
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_RESTART)
	time.Sleep(time.Hour)
}

func run() int {
	if err := leaveRootfs(); err != nil {
		fmt.Println("laneinit:", err)
		return 125
	}
	if err := mounts(); err != nil {
		fmt.Println("laneinit:", err)
		return 125
	}
	b, err := os.ReadFile("/lane/config.json")
	if err != nil {
		fmt.Println("laneinit:", err)
		return 125
	}
	var c config
	if err := json.Unmarshal(b, &c); err != nil || len(c.Argv) == 0 {
		fmt.Println("laneinit: bad config:", err)
		return 125
	}
	for _, m := range c.Modules {
		if err := loadModule(m); err != nil {
			fmt.Println("laneinit:", err)
			return 125
		}
	}
	cmd := exec.Command(c.Argv[0], c.Argv[1:]...)
	cmd.Env = append([]string{"PATH=/usr/bin:/bin:/usr/sbin:/sbin", "HOME=/tmp", "TMPDIR=/tmp"}, c.Env...)
	cmd.Dir = c.Dir
	cmd.Stdin, cmd.Stdout, cmd.Stderr = nil, os.Stdout, os.Stderr
	err = cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		if ee.ExitCode() < 0 {
			fmt.Println("laneinit: test binary:", err)
			return 128
		}
		return ee.ExitCode()
	default:
		fmt.Println("laneinit: start test binary:", err)
		return 126
	}
}

// leaveRootfs moves the root onto a bind mount of the initramfs, as
// switch_root does: pivot_root(2), which jails under test use, refuses a
// root with no parent mount, and the initramfs (rootfs) has none.
func leaveRootfs() error {
	const dir = "/.root"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("/", dir, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("bind the initramfs: %w", err)
	}
	if err := unix.Chdir(dir); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move the root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	return unix.Chdir("/")
}

func mounts() error {
	for _, m := range []struct{ src, dst, fs, data string }{
		{"devtmpfs", "/dev", "devtmpfs", "mode=0755"},
		{"proc", "/proc", "proc", ""},
		{"sysfs", "/sys", "sysfs", ""},
		{"tmpfs", "/tmp", "tmpfs", "mode=1777"},
		{"tmpfs", "/run", "tmpfs", "mode=0755"},
		{"tmpfs", "/dev/shm", "tmpfs", "mode=1777"},
	} {
		if err := os.MkdirAll(m.dst, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.src, m.dst, m.fs, 0, m.data); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s on %s: %w", m.fs, m.dst, err)
		}
	}
	return nil
}

// moduleInitCompressedFile is MODULE_INIT_COMPRESSED_FILE: the kernel
// decompresses .ko.xz itself (CONFIG_MODULE_DECOMPRESS).
const moduleInitCompressedFile = 4

func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("load module: %w", err)
	}
	defer f.Close()
	flags := 0
	if strings.HasSuffix(path, ".xz") || strings.HasSuffix(path, ".zst") || strings.HasSuffix(path, ".gz") {
		flags = moduleInitCompressedFile
	}
	if err := unix.FinitModule(int(f.Fd()), "", flags); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("load module %s: %w", path, err)
	}
	return nil
}
