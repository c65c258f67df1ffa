package memfs

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The keeper. A FUSE connection lives as long as some process holds its
// /dev/fuse descriptor; while it lives, requests wait for a server, however
// long, and mappings of its files stay valid. The keeper is a small
// process, in a session of its own (a kill of the server or of its process
// group does not reach it), that holds the descriptor and does nothing
// else: it never reads a request. A new server asks it for the descriptor
// over a Unix socket (0600, SCM_RIGHTS), with the ConnState that INIT
// negotiated, and resumes serving. The server keeps a connection to its
// keeper open and starts a new keeper (handing it the descriptor) when
// that one ends. Under systemd the service's file descriptor store
// (FileDescriptorStoreMax=, sd_pid_notify_with_fds FDSTORE=1) would hold
// the descriptor the same way; this package does not use it.
//
// What survives what: a kill of the server (even SIGKILL) with the keeper
// alive: everything (the next server takes over). A kill of the keeper
// with the server alive: everything (the server starts another). Both at
// once: the connection ends; reads fail and faults are SIGBUS.

// keeperEnv, set in a process's environment, makes it a keeper of the
// socket it names (RunKeeperIfAsked).
const keeperEnv = "AENV_MEMFS_KEEPER"

// keeperStateEnv carries the connection's ConnState to a new keeper.
const keeperStateEnv = "AENV_MEMFS_KEEPER_STATE"

// keeperMsg is a message on the keeper socket: a request (Op) or the
// answer to "get" (State, with the descriptor attached).
type keeperMsg struct {
	Op    string    `json:"op,omitempty"` // "get", "watch" or "quit"
	State ConnState `json:"state"`
	PID   int       `json:"pid,omitempty"`
	Err   string    `json:"err,omitempty"`
}

// RunKeeperIfAsked runs this process as a keeper, and exits, when it was
// started as one (by a Server); otherwise it returns at once. Programs
// that serve memfs mounts call it first thing in main (tests in TestMain).
func RunKeeperIfAsked() {
	sock := os.Getenv(keeperEnv)
	if sock == "" {
		return
	}
	if err := runKeeper(sock); err != nil {
		fmt.Fprintln(os.Stderr, "memfs keeper:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// runKeeper holds descriptor 3 (the connection) and answers on sock
// until told to quit or the connection ends; descriptor 4 is closed once
// the socket listens.
func runKeeper(sock string) error {
	var st ConnState
	if err := json.Unmarshal([]byte(os.Getenv(keeperStateEnv)), &st); err != nil {
		return fmt.Errorf("connection state: %w", err)
	}
	const fuseFD = 3
	os.Remove(sock) // a dead keeper's: the server starts one only when none answers
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		return fmt.Errorf("listen on %s: %w", sock, err)
	}
	if err := os.Chmod(sock, 0o600); err != nil {
		return fmt.Errorf("keeper socket %s: %w", sock, err)
	}
	ready := os.NewFile(4, "ready")
	ready.Write([]byte{1})
	ready.Close()
	go func() {
		// The connection ended (unmounted, or aborted): nothing to keep.
		fds := []unix.PollFd{{Fd: fuseFD}}
		for {
			if _, err := unix.Poll(fds, -1); err != nil && !errors.Is(err, unix.EINTR) {
				break
			}
			if fds[0].Revents&(unix.POLLERR|unix.POLLHUP|unix.POLLNVAL) != 0 {
				break
			}
		}
		os.Remove(sock)
		os.Exit(0)
	}()
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			return fmt.Errorf("accept on %s: %w", sock, err)
		}
		go keeperServe(c, sock, st, fuseFD)
	}
}

// keeperServe answers one server: "get" hands over the descriptor,
// "quit" ends the keeper; the connection stays open (the server watches it
// to learn that the keeper died).
func keeperServe(c *net.UnixConn, sock string, st ConnState, fd int) {
	defer c.Close()
	if !peerIsUs(c) {
		return
	}
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return
		}
		var m keeperMsg
		if json.Unmarshal(buf[:n], &m) != nil {
			return
		}
		switch m.Op {
		case "get":
			b, _ := json.Marshal(keeperMsg{State: st, PID: os.Getpid()})
			if _, _, err := c.WriteMsgUnix(b, unix.UnixRights(fd), nil); err != nil {
				return
			}
		case "quit":
			os.Remove(sock)
			c.Write([]byte(`{}`))
			os.Exit(0)
		}
	}
}

// peerIsUs accepts only processes of the keeper's own uid (root).
func peerIsUs(c *net.UnixConn) bool {
	raw, err := c.SyscallConn()
	if err != nil {
		return false
	}
	var cred *unix.Ucred
	raw.Control(func(fd uintptr) { cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	return err == nil && cred != nil && int(cred.Uid) == os.Getuid()
}

// keeperGet asks the keeper at sock for its connection: the descriptor,
// its state, and the open socket (to watch the keeper with).
func keeperGet(sock string) (int, keeperMsg, *net.UnixConn, error) {
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		return -1, keeperMsg{}, nil, fmt.Errorf("dial keeper %s: %w", sock, err)
	}
	fd, m, err := keeperGetOn(c)
	if err != nil {
		c.Close()
		return -1, keeperMsg{}, nil, fmt.Errorf("keeper %s: %w", sock, err)
	}
	return fd, m, c, nil
}

func keeperGetOn(c *net.UnixConn) (int, keeperMsg, error) {
	var m keeperMsg
	c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write([]byte(`{"op":"get"}`)); err != nil {
		return -1, m, err
	}
	buf, oob := make([]byte, 4096), make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return -1, m, err
	}
	if err := json.Unmarshal(buf[:n], &m); err != nil {
		return -1, m, err
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil || len(msgs) != 1 {
		return -1, m, fmt.Errorf("no descriptor in the answer (%v)", err)
	}
	fds, err := unix.ParseUnixRights(&msgs[0])
	if err != nil || len(fds) != 1 {
		return -1, m, fmt.Errorf("no descriptor in the answer (%v)", err)
	}
	unix.CloseOnExec(fds[0])
	return fds[0], m, nil
}

// keeperQuit tells the keeper on c to drop its descriptor and exit.
func keeperQuit(c *net.UnixConn) {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(`{"op":"quit"}`)); err == nil {
		c.Read(make([]byte, 64))
	}
	c.Close()
}

// KeeperPID returns the pid of the keeper answering at sock (for tests
// and operators).
func KeeperPID(sock string) (int, error) {
	fd, m, c, err := keeperGet(sock)
	if err != nil {
		return 0, err
	}
	unix.Close(fd)
	c.Close()
	return m.PID, nil
}

// keeperLink is a server's side of its keeper: it starts one when none
// holds the connection and watches it.
type keeperLink struct {
	s    *Server
	sock string
	cmd  []string
	log  *slog.Logger

	mu      sync.Mutex
	conn    *net.UnixConn // to the live keeper, or nil
	stopped bool
	done    chan struct{} // closed when run returns
}

func newKeeperLink(s *Server, opts Options) *keeperLink {
	return &keeperLink{s: s, sock: opts.KeeperSocket, cmd: opts.KeeperCommand, log: opts.Logger, done: make(chan struct{})}
}

// start starts a keeper unless one holds the connection (run retries on
// failure).
func (k *keeperLink) start() {
	k.mu.Lock()
	have := k.conn != nil
	k.mu.Unlock()
	if have {
		return
	}
	c, err := k.spawn()
	if err != nil {
		k.log.Error("memfs: start keeper: the mount dies with this process until one starts", "keeper", k.sock, "err", err)
		return
	}
	k.mu.Lock()
	k.conn = c
	k.mu.Unlock()
}

// run keeps a keeper alive until stop: it starts one when there is none
// and waits for the one there is to end.
func (k *keeperLink) run() {
	defer close(k.done)
	for wait := time.Duration(0); ; {
		k.mu.Lock()
		c, stopped := k.conn, k.stopped
		k.mu.Unlock()
		if stopped {
			return
		}
		if c == nil {
			var err error
			if c, err = k.spawn(); err != nil {
				k.log.Error("memfs: start keeper: the mount dies with this process until one starts", "keeper", k.sock, "err", err)
				wait = min(max(2*wait, time.Second), time.Minute)
				time.Sleep(wait)
				continue
			}
			wait = 0
			k.mu.Lock()
			k.conn = c
			stopped = k.stopped
			k.mu.Unlock()
			if stopped { // stop came while this one started
				keeperQuit(c)
				return
			}
		}
		c.Read(make([]byte, 64)) // returns when the keeper ends (or stop closes c)
		k.mu.Lock()
		k.conn = nil
		stopped = k.stopped
		k.mu.Unlock()
		c.Close()
		if !stopped {
			k.log.Warn("memfs: keeper ended: starting another", "keeper", k.sock)
		}
	}
}

// spawn starts a keeper with the connection and returns a socket to it.
func (k *keeperLink) spawn() (*net.UnixConn, error) {
	argv := k.cmd
	if len(argv) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		// The flag makes a program that does not call RunKeeperIfAsked
		// fail at once (an unknown flag) instead of running as itself.
		argv = []string{exe, "-aenv-memfs-keeper"}
	}
	st, err := json.Marshal(k.s.c.negotiated())
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), keeperEnv+"="+k.sock, keeperStateEnv+"="+string(st))
	cmd.ExtraFiles = []*os.File{k.s.file, w}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if logf, err := os.OpenFile(k.sock+".log", os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600); err == nil {
		cmd.Stderr = logf
		defer logf.Close()
	}
	err = cmd.Start()
	w.Close()
	if err != nil {
		return nil, fmt.Errorf("memfs: start keeper %s: %w", argv[0], err)
	}
	go cmd.Wait() // reap it, should it end while this process lives
	if n, _ := r.Read(make([]byte, 1)); n != 1 {
		return nil, fmt.Errorf("memfs: keeper %s ended before it listened (see %s.log)", argv[0], k.sock)
	}
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: k.sock, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("memfs: dial keeper %s: %w", k.sock, err)
	}
	if _, err := c.Write([]byte(`{"op":"watch"}`)); err != nil {
		c.Close()
		return nil, fmt.Errorf("memfs: keeper %s: %w", k.sock, err)
	}
	k.log.Info("memfs: keeper holds the connection", "keeper", k.sock, "pid", cmd.Process.Pid)
	return c, nil
}

// stop tells the keeper to drop the connection and exit, and stops
// starting new ones.
func (k *keeperLink) stop() {
	k.mu.Lock()
	k.stopped = true
	c := k.conn
	k.conn = nil
	k.mu.Unlock()
	if c != nil {
		keeperQuit(c)
	}
}
