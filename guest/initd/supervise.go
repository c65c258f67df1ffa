package initd

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// supervise runs the agent as a child, reaps every orphan, restarts the
// agent if it dies and powers off on SIGTERM, SIGINT (Ctrl-Alt-Del) or SIGPWR.
func supervise(log *slog.Logger, cl *Cmdline) error {
	// Ctrl-Alt-Del from the VMM becomes SIGINT to PID 1 instead of an instant reboot.
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_CAD_OFF)
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, unix.SIGCHLD, unix.SIGTERM, unix.SIGINT, unix.SIGPWR)

	agent, err := startAgent(cl)
	if err != nil {
		return err
	}
	go announceReady(log)
	backoff := 100 * time.Millisecond
	for sig := range sigs {
		if sig != unix.SIGCHLD {
			log.Info("shutting down", "signal", sig)
			shutdown(log, agent)
			return nil
		}
		if !reap(agent.Process.Pid) {
			continue
		}
		log.Warn("agent exited; restarting", "backoff", backoff)
		time.Sleep(backoff)
		backoff = min(backoff*2, 5*time.Second)
		if agent, err = startAgent(cl); err != nil {
			return err
		}
	}
	return nil
}

func startAgent(cl *Cmdline) (*exec.Cmd, error) {
	args := append([]string{"--addr", AgentAddr}, cl.AgentArgs...)
	cmd := exec.Command("/proc/self/exe", args...)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), "HOME=/root", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	cmd.Dir = "/"
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start agent: %w", err)
	}
	return cmd, nil
}

// reap collects every exited child and reports whether the agent was one.
func reap(agentPID int) bool {
	agentDied := false
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err != nil || pid <= 0 {
			return agentDied
		}
		if pid == agentPID {
			agentDied = true
		}
	}
}

// announceReady prints ReadyLine on the console once the agent answers.
func announceReady(log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	hc := &http.Client{Timeout: time.Second}
	for ctx.Err() == nil {
		resp, err := hc.Get("http://127.0.0.1" + AgentAddr + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode < 300 {
				fmt.Fprintln(os.Stdout, ReadyLine)
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	log.Error("agent never became healthy")
}

// shutdown stops every process, flushes the filesystems and powers off.
func shutdown(log *slog.Logger, agent *exec.Cmd) {
	_ = agent.Process.Signal(syscall.SIGTERM)
	_ = unix.Kill(-1, unix.SIGTERM)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		reap(0)
		if !anyChildren() {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = unix.Kill(-1, unix.SIGKILL)
	reap(0)
	powerOff(log)
}

// anyChildren reaps what has exited and reports whether children remain.
func anyChildren() bool {
	var ws unix.WaitStatus
	_, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
	return err != unix.ECHILD
}

func powerOff(log *slog.Logger) {
	unix.Sync()
	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		log.Warn("remount / read-only", "err", err)
	}
	unix.Sync()
	log.Info("power off")
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	select {}
}
