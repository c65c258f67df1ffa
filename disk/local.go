package disk

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"

	"github.com/agentenv/agentenv/storage/daemon"
	"github.com/agentenv/agentenv/storage/daemon/client"
)

// Local is the storage daemon run in the node's own process (storage
// backend "local", formerly "files"): the same devices as aenv-storaged's,
// kept under dir (state/, run/ as aenv-storaged's -state-dir and
// -run-dir), without a process of their own. The devices end with the
// node's process; the next one re-opens the state directory and serves
// every device again on the same export sockets, where the VMs a crash left
// running reconnect.
type Local struct {
	d      *daemon.Daemon
	cancel context.CancelFunc
	done   chan error
}

// StartLocal runs the storage daemon in process on dir and returns once it
// serves (it recovered its state directory).
func StartLocal(ctx context.Context, dir string, log *slog.Logger) (*Local, error) {
	if log == nil {
		log = slog.Default()
	}
	d, err := daemon.New(daemon.Options{StateDir: filepath.Join(dir, "state"), RunDir: filepath.Join(dir, "run"),
		Logger: log.With("component", "storaged")})
	if err != nil {
		return nil, fmt.Errorf("in-process storage daemon: %w", err)
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	l := &Local{d: d, cancel: cancel, done: make(chan error, 1)}
	go func() { l.done <- d.Run(rctx) }()
	ready := make(chan error, 1)
	go func() {
		_, err := d.Local().Features(rctx)
		ready <- err
	}()
	select {
	case err := <-ready:
		if err == nil {
			return l, nil
		}
		cancel()
		<-l.done
		return nil, fmt.Errorf("in-process storage daemon on %s: %w", dir, err)
	case err := <-l.done:
		cancel()
		return nil, fmt.Errorf("in-process storage daemon on %s: %w", dir, err)
	case <-ctx.Done():
		cancel()
		<-l.done
		return nil, fmt.Errorf("in-process storage daemon on %s: %w", dir, ctx.Err())
	}
}

// Devices is the daemon's device API.
func (l *Local) Devices() Devices { return l.d.Local() }

// Close stops every export (the state stays for the next start).
func (l *Local) Close() error {
	l.cancel()
	return <-l.done
}

// Storaged is aenv-storaged, a process of its own that outlives the node's.
type Storaged struct{ c *client.Client }

// ConnectStoraged connects to aenv-storaged on socket, starting bin (its
// log to logFile, its state and export sockets under stateDir and runDir,
// extra flags args) when nothing answers there.
func ConnectStoraged(ctx context.Context, socket, bin, logFile, stateDir, runDir string, args ...string) (*Storaged, error) {
	c, err := client.Ensure(ctx, client.StartOptions{
		Socket: socket, Binary: bin, LogFile: logFile,
		Args: append([]string{"-state-dir", stateDir, "-run-dir", runDir}, args...),
	})
	if err != nil {
		return nil, fmt.Errorf("storage daemon: %w", err)
	}
	return &Storaged{c: c}, nil
}

// Devices is the daemon's device API over its socket.
func (s *Storaged) Devices() Devices { return s.c }

// Close closes the connection (the daemon and its devices stay).
func (s *Storaged) Close() error { return s.c.Close() }
