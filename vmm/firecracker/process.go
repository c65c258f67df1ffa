package firecracker

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// tail keeps the last bytes written to it: Firecracker explains fatal
// start-up problems on stderr, and those lines belong in our errors.
type tail struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(string(t.buf))
}

// proc is one VMM (or jailer) process and the record of its exit.
type proc struct {
	cmd    *exec.Cmd
	stderr *tail
	done   chan struct{}
	err    error // cmd.Wait's result, valid once done is closed
	killed bool  // set before we kill it on purpose
	mu     sync.Mutex
}

// startProc starts argv with stdout on console (the guest's serial port is
// Firecracker's stdout) and stderr captured.
func startProc(argv []string, console *os.File, netns string) (*proc, error) {
	p := &proc{stderr: &tail{max: 4096}, done: make(chan struct{})}
	// The serial port reads stdin: a pipe nobody writes to can be polled,
	// where /dev/null cannot.
	stdin, hold, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("console input pipe: %w", err)
	}
	defer stdin.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin = stdin
	cmd.Stdout = console
	cmd.Stderr = p.stderr
	// A process group of its own keeps a Ctrl-C aimed at the node server
	// from taking every VM down with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := cmd.Start
	if netns != "" {
		start = func() error { return inNetNS(netns, cmd.Start) }
	}
	if err := start(); err != nil {
		_ = hold.Close()
		return nil, fmt.Errorf("start %s: %w", argv[0], err)
	}
	p.cmd = cmd
	go func() {
		p.err = cmd.Wait()
		_ = hold.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// exitErr is how the process ended, with its last stderr lines.
type exitErr struct {
	status string
	stderr string
}

func (e *exitErr) Error() string {
	if e.stderr != "" {
		return fmt.Sprintf("firecracker exited (%s): %s", e.status, e.stderr)
	}
	return fmt.Sprintf("firecracker exited (%s)", e.status)
}

// exitError describes the ended process; call it once done is closed.
func (p *proc) exitError() error {
	status := "exit status 0"
	if p.err != nil {
		status = p.err.Error()
	}
	return &exitErr{status: status, stderr: p.stderr.String()}
}

// kill ends the process and waits for it; it is idempotent.
func (p *proc) kill() {
	p.mu.Lock()
	p.killed = true
	p.mu.Unlock()
	if !p.exited() {
		_ = p.cmd.Process.Kill()
	}
	<-p.done
}

func (p *proc) wasKilled() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.killed
}

// waitSocket waits until the API socket accepts connections, the process
// dies, ctx ends or timeout passes, whichever comes first.
func (p *proc) waitSocket(ctx context.Context, socket string, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if c, err := net.Dial("unix", socket); err == nil {
			_ = c.Close()
			return nil
		}
		select {
		case <-p.done:
			return p.exitError()
		case <-ctx.Done():
			return fmt.Errorf("wait for API socket %s: %w", socket, ctx.Err())
		case <-deadline.C:
			return fmt.Errorf("wait for API socket %s: not ready after %s", socket, timeout)
		case <-tick.C:
		}
	}
}

// blame replaces an API error with the process's exit when the process died:
// "connection refused" says less than Firecracker's own last words.
func (p *proc) blame(err error) error {
	var ee *exitErr
	if err == nil || errors.As(err, &ee) {
		return err
	}
	select {
	case <-p.done:
	case <-time.After(100 * time.Millisecond):
		return err
	}
	return fmt.Errorf("%w (api: %v)", p.exitError(), err)
}

var errNoSocketRoom = errors.New("path too long for a Unix socket (max 107 bytes)")

func checkSocketPath(path string) error {
	if len(path) > 107 {
		return fmt.Errorf("API socket %s: %w", path, errNoSocketRoom)
	}
	return nil
}

// inNetNS runs fn on an OS thread switched into the network namespace at
// path. A child forked there starts in that namespace, which is how a VMM
// reaches taps that exist only inside a sandbox's namespace.
func inNetNS(path string, fn func() error) error {
	target, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("network namespace %s: %w", path, err)
	}
	defer unix.Close(target)
	runtime.LockOSThread()
	orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("current network namespace: %w", err)
	}
	defer unix.Close(orig)
	if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("enter network namespace %s: %w", path, err)
	}
	fnErr := fn()
	if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
		// The thread stays locked and dies with this goroutine rather than
		// serving others from the wrong namespace.
		return errors.Join(fnErr, fmt.Errorf("leave network namespace %s: %w", path, err))
	}
	runtime.UnlockOSThread()
	return fnErr
}
