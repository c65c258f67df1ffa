// Package redistest starts a real redis-server for the cluster's tests: on a
// loopback port, in a temporary directory, with append-only persistence, so
// a test can stop and restart it and see what survived.
package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/agentenv/agentenv/internal/testenv"
)

// Server is one redis-server process and the directory it persists to.
type Server struct {
	Addr string
	dir  string
	cmd  *exec.Cmd
	t    testing.TB
}

// Start runs redis-server, or skips the test when the binary is absent
// (.ci/setup.d/61-cluster.sh installs it; under CI=true the test fails:
// internal/testenv).
func Start(t testing.TB) *Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		testenv.Missing(t, "redis-server is not installed (Debian package redis-server; .ci/setup.d/61-cluster.sh)")
	}
	s := &Server{Addr: freeAddr(t), dir: t.TempDir(), t: t}
	s.start()
	t.Cleanup(s.Stop)
	return s
}

func freeAddr(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: free port: %v", err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func (s *Server) start() {
	s.t.Helper()
	host, port, _ := net.SplitHostPort(s.Addr)
	log, err := os.OpenFile(filepath.Join(s.dir, "redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		s.t.Fatalf("redistest: log: %v", err)
	}
	defer log.Close()
	cmd := exec.Command("redis-server", "--bind", host, "--port", port, "--dir", s.dir,
		"--appendonly", "yes", "--appendfsync", "always", "--save", "", "--daemonize", "no",
		"--protected-mode", "no", "--logfile", "")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("redistest: start redis-server: %v", err)
	}
	s.cmd = cmd
	if err := s.waitReady(10 * time.Second); err != nil {
		b, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
		s.t.Fatalf("redistest: %v\n%s", err, b)
	}
}

func (s *Server) waitReady(limit time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(limit)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server at %s not ready: %w", s.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop shuts the server down gracefully (SIGTERM: it finishes its
// append-only file) and waits for it. Stopping a stopped server is a no-op.
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	_ = s.cmd.Wait()
	s.cmd = nil
}

// Restart stops the server and starts it again on the same port and
// directory: what persisted is what the next client sees.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.start()
}

// Pid is the running server's process id (0 when stopped).
func (s *Server) Pid() int {
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Port is the server's TCP port.
func (s *Server) Port() int {
	_, p, _ := net.SplitHostPort(s.Addr)
	n, _ := strconv.Atoi(p)
	return n
}

// Client returns a client of the server, closed when the test ends.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}
