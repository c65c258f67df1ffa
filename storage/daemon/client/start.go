package client

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// StartOptions say how to run aenv-storaged when nothing answers on Socket.
type StartOptions struct {
	Socket string
	// Binary is the aenv-storaged executable.
	Binary string
	// Args are extra flags (-state-dir, -run-dir, -pool-low, ...); -socket is added.
	Args []string
	// Env is the daemon's environment (default: the caller's).
	Env []string
	// LogFile receives the daemon's stderr (default: discarded).
	LogFile string
}

// Ensure connects to the daemon, starting it first if nothing answers. The
// daemon runs in its own session, so it outlives the caller: devices survive
// aenvd restarts. Two callers racing here are safe: the loser's daemon fails
// on the state-directory lock and both connect to the winner.
func Ensure(ctx context.Context, opts StartOptions) (*Client, error) {
	if c, err := Dial(ctx, opts.Socket); err == nil {
		return c, nil
	}
	cmd := exec.Command(opts.Binary, append([]string{"-socket", opts.Socket}, opts.Args...)...)
	cmd.Env = opts.Env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if opts.LogFile != "" {
		f, err := os.OpenFile(opts.LogFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return nil, fmt.Errorf("start storaged: log file: %w", err)
		}
		defer f.Close()
		cmd.Stderr = f
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start storaged %s: %w", opts.Binary, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }() // reap it if it dies while we run
	for {
		if c, err := Dial(ctx, opts.Socket); err == nil {
			return c, nil
		}
		select {
		case err := <-exited:
			// Maybe another daemon won the race for the state dir; try it.
			if c, derr := Dial(ctx, opts.Socket); derr == nil {
				return c, nil
			}
			return nil, fmt.Errorf("start storaged: exited: %v (see %s)", err, opts.LogFile)
		case <-ctx.Done():
			cmd.Process.Kill()
			return nil, fmt.Errorf("start storaged: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
