// Package initd holds the duties of PID 1 inside a sandbox VM: load kernel
// modules, mount the pseudo filesystems, switch from the initramfs to the real
// root, configure the network from the kernel command line, start the agent
// as a supervised child, reap orphans and power the machine off cleanly.
//
// The agent itself never runs as PID 1: initd starts /proc/self/exe again as
// a child, so the agent's own exec.Cmd.Wait calls never race with the reaper
// that collects orphans re-parented to PID 1.
package initd

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// InitramfsMarker exists only in the initramfs built by guest/image; its
// presence tells PID 1 it still has to switch to the real root.
const InitramfsMarker = "/.aenv-initramfs"

// ReadyLine is printed on the console once the agent answers /health.
const ReadyLine = "aenv-agent: ready"

// AgentAddr is where the supervised agent listens.
const AgentAddr = ":49983"

// Main runs PID 1 and never returns.
func Main() {
	start := time.Now()
	setupConsole()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("component", "initd")
	if err := run(log, start); err != nil {
		log.Error("init failed; powering off", "err", err)
		powerOff(log)
	}
	select {} // unreachable: run either execs, supervises forever or powers off
}

func run(log *slog.Logger, start time.Time) error {
	if err := mountEarly(); err != nil {
		return err
	}
	cmdlineBytes, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return fmt.Errorf("read /proc/cmdline: %w", err)
	}
	cl, err := ParseCmdline(string(cmdlineBytes))
	if err != nil {
		return err
	}
	if _, err := os.Stat(InitramfsMarker); err == nil {
		if err := loadModules(log, "/lib/modules/load.list"); err != nil {
			return err
		}
		if cl.Root != "none" {
			// switchRoot execs the agent from the real root; it only returns on error.
			return switchRoot(log, cl)
		}
	}
	if err := mountLate(); err != nil {
		return err
	}
	if err := configureSystem(log, cl); err != nil {
		return err
	}
	log.Info("system up", "since_init", time.Since(start).Round(time.Millisecond))
	return supervise(log, cl)
}

// setupConsole makes sure fds 0-2 are the console: the kernel opens
// /dev/console only if it exists when PID 1 starts.
func setupConsole() {
	if _, err := unix.FcntlInt(1, unix.F_GETFD, 0); err == nil {
		return
	}
	_ = os.MkdirAll("/dev", 0o755)
	_ = unix.Mount("devtmpfs", "/dev", "devtmpfs", unix.MS_NOSUID, "mode=0755")
	fd, err := unix.Open("/dev/console", unix.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return
	}
	for i := 0; i < 3; i++ {
		_ = unix.Dup2(fd, i)
	}
	if fd > 2 {
		_ = unix.Close(fd)
	}
}
