// Package aenvdtest runs aenvd as a real process for tests and benchmarks:
// it builds aenvd and aenv-agent from this checkout, uses the cached guest
// assets, and starts the server on free loopback ports with a data
// directory, network prefix and address ranges of its own.
package aenvdtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentenv/agentenv/guest/agent/agentclient"
	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/internal/testutil/guestassets"
	"github.com/agentenv/agentenv/storage/daemon/client"
)

// Key is the API key every test node accepts.
const Key = "e2b_ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12"

// Node is one aenvd process (restartable on the same data directory).
type Node struct {
	API, Proxy string // base URLs
	Key        string
	DataDir    string
	work       string
	bin, agent string
	env        []string

	cmd   *exec.Cmd
	done  chan error
	ended *os.ProcessState // set when RestartWith saw the process end
	lock  *os.File         // the network prefix's host-wide lock
	mu    sync.Mutex
	log   bytes.Buffer
}

// Options tune a node.
type Options struct {
	// Prefix names the node's network objects (default "adtest"); nodes
	// running at once need distinct prefixes and ranges.
	Prefix string
	// CIDRBase is the second octet of the host and veth ranges (10.<b>.0.0/16
	// and 10.<b+1>.0.0/16); default 81.
	CIDRBase int
	// Env adds AENVD_* overrides.
	Env []string
	// Source is a checkout of this module to build aenvd and aenv-storaged
	// from (default: this one); benchmarks compare against an older commit.
	Source string
}

// Start builds and starts aenvd and waits for /health (the first start on a
// data directory builds the template: allow minutes under TCG).
func Start(ctx context.Context, opts Options) (*Node, error) {
	if opts.Prefix == "" {
		opts.Prefix = "adtest"
	}
	if opts.CIDRBase == 0 {
		opts.CIDRBase = 81
	}
	lock, err := lockPrefix(ctx, opts.Prefix)
	if err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "aenvd-test-")
	if err != nil {
		lock.Close()
		return nil, err
	}
	n := &Node{DataDir: filepath.Join(work, "data"), work: work, bin: filepath.Join(work, "aenvd"), Key: Key, lock: lock}
	defer func() {
		if n.cmd == nil || n.cmd.ProcessState != nil {
			lock.Close() // not started: nobody holds the prefix
		}
	}()
	if n.agent, err = guestassets.BuildAgent(ctx); err != nil {
		os.RemoveAll(work)
		return nil, err
	}
	// aenv-storaged goes next to aenvd, where aenvd looks for it.
	args := []string{"build", "-o", work + "/"}
	if opts.Source != "" {
		args = []string{"build", "-C", opts.Source, "-o", work + "/"} // -C must come first
	}
	if os.Getenv("AENVDTEST_RACE") == "1" {
		args = append(args, "-race") // a detected race makes the process exit 66
	}
	build := exec.CommandContext(ctx, "go", append(args, "./cmd/aenvd", "./cmd/aenv-storaged")...)
	if opts.Source == "" {
		build.Dir = moduleRoot()
	}
	if out, err := build.CombinedOutput(); err != nil {
		os.RemoveAll(work)
		return nil, fmt.Errorf("build aenvd: %w\n%s", err, out)
	}
	apiAddr, proxyAddr := freePort(), freePort()
	if apiAddr == "" || proxyAddr == "" {
		os.RemoveAll(work)
		return nil, fmt.Errorf("no free loopback port")
	}
	n.API, n.Proxy = "http://"+apiAddr, "http://"+proxyAddr
	n.env = append(os.Environ(),
		"AENVD_DATA_DIR="+n.DataDir, "AENVD_API_LISTEN="+apiAddr, "AENVD_API_PROXY_LISTEN="+proxyAddr,
		"AENVD_API_KEY="+n.Key, "AENVD_GUEST_AGENT="+n.agent, "AENVD_GUEST_MEMORY_MIB=256",
		"AENVD_NETWORK_PREFIX="+opts.Prefix,
		fmt.Sprintf("AENVD_NETWORK_HOST_CIDR=10.%d.0.0/16", opts.CIDRBase),
		fmt.Sprintf("AENVD_NETWORK_VETH_CIDR=10.%d.0.0/16", opts.CIDRBase+1),
		"AENVD_NETWORK_POOL_LOW=1", "AENVD_NETWORK_POOL_HIGH=4", "AENVD_SANDBOX_DEFAULT_TIMEOUT=60s",
		// Nodes on one host confine their VMMs in uid ranges apart.
		fmt.Sprintf("AENVD_VMM_UID_BASE=%d", 2_000_000_000+opts.CIDRBase<<16))
	n.env = append(n.env, failpoint.ControlEnvVar+"="+n.FailpointSocket())
	n.env = append(n.env, opts.Env...)
	if err := n.Restart(ctx, 10*time.Minute); err != nil {
		os.RemoveAll(work)
		return nil, err
	}
	return n, err
}

// Restart starts the process (again) and waits for /health within limit.
func (n *Node) Restart(ctx context.Context, limit time.Duration) error {
	return n.RestartWith(ctx, limit)
}

// RestartWith is Restart with env added for this start only (e.g.
// failpoint.EnvVar, to arm a point the start itself reaches).
func (n *Node) RestartWith(ctx context.Context, limit time.Duration, env ...string) error {
	n.cmd, n.ended = exec.Command(n.bin), nil
	n.cmd.Env = append(slices.Clone(n.env), env...)
	n.cmd.Stdout, n.cmd.Stderr = n, n
	if err := n.cmd.Start(); err != nil {
		return fmt.Errorf("start aenvd: %w", err)
	}
	n.done = make(chan error, 1)
	go func() { n.done <- n.cmd.Wait() }()
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		select {
		case err := <-n.done:
			n.ended = n.cmd.ProcessState
			return fmt.Errorf("aenvd exited early: %v\n%s", err, n.Logs())
		case <-ctx.Done():
			_ = n.Stop(syscall.SIGKILL)
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		resp, err := http.Get(n.API + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusNoContent {
				return nil
			}
		}
	}
	_ = n.Stop(syscall.SIGKILL)
	return fmt.Errorf("aenvd not healthy within %s\n%s", limit, n.Logs())
}

// FailpointSocket is the control socket through which tests arm aenvd's
// fault points (internal/failpoint).
func (n *Node) FailpointSocket() string { return filepath.Join(n.work, "failpoints.sock") }

// Arm arms one of aenvd's fault points in the running process ("" disarms).
func (n *Node) Arm(name, action string) error {
	return failpoint.ArmRemote(n.FailpointSocket(), name, action)
}

// WaitExit waits up to limit for the process to end by itself (a fault
// point's crash) and returns how it ended.
func (n *Node) WaitExit(limit time.Duration) (*os.ProcessState, error) {
	if n.ended != nil {
		return n.ended, nil // its end was received already (an early exit in RestartWith)
	}
	select {
	case <-n.done:
		return n.cmd.ProcessState, nil
	case <-time.After(limit):
		return nil, fmt.Errorf("aenvd still runs after %s", limit)
	}
}

// Stop signals the process and waits for it (SIGTERM: graceful shutdown,
// whose exit status is returned; SIGKILL: a crash).
func (n *Node) Stop(sig syscall.Signal) error {
	if n.cmd.ProcessState != nil {
		return nil // stopped already (its exit was received): a Close after a kill must not wait for a second one
	}
	_ = n.cmd.Process.Signal(sig)
	select {
	case err := <-n.done:
		if sig == syscall.SIGKILL {
			return nil
		}
		return err
	case <-time.After(3 * time.Minute):
		_ = n.cmd.Process.Kill()
		<-n.done
		return fmt.Errorf("aenvd did not stop on %s", sig)
	}
}

// Close stops the node gracefully, then the storage daemon it started (which
// outlives aenvd by design), and removes its files.
func (n *Node) Close() error {
	err := n.Stop(syscall.SIGTERM)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if c, derr := client.Dial(ctx, filepath.Join(n.DataDir, "storaged", "storaged.sock")); derr == nil {
		_ = c.Shutdown(ctx)
		c.Close()
	}
	os.RemoveAll(n.work)
	n.lock.Close()
	return err
}

// lockPrefix takes a host-wide lock on a network prefix: two nodes with one
// prefix (the same test package run twice at once, by two engineers or a
// developer and CI) would clean up and reuse each other's namespaces and
// addresses, wiring sandboxes to the other node's VMs. The second waits.
func lockPrefix(ctx context.Context, prefix string) (*os.File, error) {
	path := filepath.Join(os.TempDir(), "aenvdtest-"+prefix+".lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock network prefix %s: %w", prefix, err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil // released when f is closed (or the process dies)
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock network prefix %s: %w", prefix, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("another aenvd test node holds network prefix %s (%s): %w", prefix, path, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// Write collects the process's output (io.Writer).
func (n *Node) Write(p []byte) (int, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.log.Write(p)
}

// Logs returns the process's output so far.
func (n *Node) Logs() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.log.String()
}

// Call sends a control API request (key "" sends none) and returns status,
// body and headers.
func (n *Node) Call(method, path, key, body string) (int, []byte, http.Header, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, n.API+path, rd)
	if err != nil {
		return 0, nil, nil, err
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 3 * time.Minute}).Do(req)
	if err != nil {
		return 0, nil, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header, err
}

// Create creates a sandbox from body and returns its id.
func (n *Node) Create(body string) (string, error) {
	code, b, _, err := n.Call("POST", "/sandboxes", n.Key, body)
	if err != nil {
		return "", err
	}
	var sbx struct {
		SandboxID string `json:"sandboxID"`
	}
	if code != http.StatusCreated || json.Unmarshal(b, &sbx) != nil || sbx.SandboxID == "" {
		return "", fmt.Errorf("create %s: %d %s", body, code, b)
	}
	return sbx.SandboxID, nil
}

// Sh runs a bash script as root in sandbox id, through the node's proxy to
// the sandbox's agent, and returns its stdout; a non-zero exit is an error
// that carries its stderr.
func (n *Node) Sh(ctx context.Context, id, script string) (string, error) {
	out, stderr, code, err := agentclient.RunWith(ctx, n.Proxy, AgentClient(id), []agentclient.Option{agentclient.WithUser("root")}, "/bin/bash", "-c", script)
	if err == nil && code != 0 {
		err = fmt.Errorf("exit %d: %s", code, bytes.TrimSpace(stderr))
	}
	if err != nil {
		return "", fmt.Errorf("sandbox %s: %q: %w", id, script, err)
	}
	return string(out), nil
}

// AgentClient returns a client whose requests to the node's proxy reach
// sandbox id's agent (the E2B routing headers on every request).
func AgentClient(id string) *http.Client { return &http.Client{Transport: agentRoute{id}} }

// agentRoute routes requests through aenvd's proxy to a sandbox's agent.
type agentRoute struct{ id string }

func (r agentRoute) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set("E2b-Sandbox-Id", r.id)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	return http.DefaultTransport.RoundTrip(req)
}

// Metrics returns the Prometheus text of /metrics.
func (n *Node) Metrics() (string, error) {
	resp, err := http.Get(n.API + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func freePort() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return ""
	}
	defer ln.Close()
	return ln.Addr().String()
}

// moduleRoot is the directory of this module's go.mod.
func moduleRoot() string {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "."
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}
