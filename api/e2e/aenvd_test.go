package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/testutil/guestassets"
)

// node is one running aenvd process.
type node struct {
	api, proxy string // base URLs
	key        string
	dataDir    string
	cmd        *exec.Cmd
	log        *bytes.Buffer
	done       chan error
	bin, agent string
	env        []string
}

var (
	shared     *node
	sharedErr  error
	sharedOnce sync.Once
	workDir    string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if shared != nil {
		if err := shared.stop(syscall.SIGTERM); err != nil {
			fmt.Fprintf(os.Stderr, "aenvd shutdown: %v\n", err)
			code = 1
		}
	}
	if workDir != "" {
		os.RemoveAll(workDir)
	}
	os.Exit(code)
}

// sharedNode starts aenvd once per test binary (building the template once).
func sharedNode(t *testing.T) *node {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("aenvd needs root (network namespaces, taps); CI runs as root")
	}
	guestassets.Get(t) // builds the agent and the guest image (cached), with clear errors
	sharedOnce.Do(func() {
		shared, sharedErr = startNode()
	})
	if sharedErr != nil {
		t.Fatalf("start aenvd: %v", sharedErr)
	}
	return shared
}

func startNode() (*node, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var err error
	if workDir, err = os.MkdirTemp("", "aenvd-e2e-"); err != nil {
		return nil, err
	}
	n := &node{dataDir: filepath.Join(workDir, "data"), bin: filepath.Join(workDir, "aenvd"), key: "e2b_" + strings.Repeat("ab12", 10)}
	if n.agent, err = guestassets.BuildAgent(ctx); err != nil {
		return nil, err
	}
	build := exec.CommandContext(ctx, "go", "build", "-o", n.bin, "github.com/agentenv/agentenv/cmd/aenvd")
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build aenvd: %w\n%s", err, out)
	}
	apiAddr, proxyAddr := freePort(), freePort()
	n.api, n.proxy = "http://"+apiAddr, "http://"+proxyAddr
	n.env = append(os.Environ(),
		"AENVD_DATA_DIR="+n.dataDir, "AENVD_API_LISTEN="+apiAddr, "AENVD_API_PROXY_LISTEN="+proxyAddr,
		"AENVD_API_KEY="+n.key, "AENVD_GUEST_AGENT="+n.agent, "AENVD_GUEST_MEMORY_MIB=256",
		// A prefix and ranges of our own, apart from a real node's and other tests'.
		"AENVD_NETWORK_PREFIX=adtest", "AENVD_NETWORK_HOST_CIDR=10.81.0.0/16", "AENVD_NETWORK_VETH_CIDR=10.82.0.0/16",
		"AENVD_NETWORK_POOL_LOW=1", "AENVD_NETWORK_POOL_HIGH=4", "AENVD_SANDBOX_DEFAULT_TIMEOUT=60s")
	if err := n.start(ctx, 8*time.Minute); err != nil {
		return nil, err
	}
	return n, nil
}

func (n *node) start(ctx context.Context, within time.Duration) error {
	n.log = &bytes.Buffer{}
	n.cmd = exec.Command(n.bin)
	n.cmd.Env = n.env
	n.cmd.Stdout, n.cmd.Stderr = syncWriter(n.log), syncWriter(n.log)
	if err := n.cmd.Start(); err != nil {
		return fmt.Errorf("start aenvd: %w", err)
	}
	n.done = make(chan error, 1)
	go func() { n.done <- n.cmd.Wait() }()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		select {
		case err := <-n.done:
			return fmt.Errorf("aenvd exited early: %v\n%s", err, n.logs())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		resp, err := http.Get(n.api + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusNoContent {
				return nil
			}
		}
	}
	_ = n.stop(syscall.SIGKILL)
	return fmt.Errorf("aenvd not healthy within %s\n%s", within, n.logs())
}

func (n *node) stop(sig syscall.Signal) error {
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

var logMu sync.Mutex

type lockedWriter struct{ b *bytes.Buffer }

func (w lockedWriter) Write(p []byte) (int, error) {
	logMu.Lock()
	defer logMu.Unlock()
	return w.b.Write(p)
}

func syncWriter(b *bytes.Buffer) io.Writer { return lockedWriter{b} }

func (n *node) logs() string {
	logMu.Lock()
	defer logMu.Unlock()
	return n.log.String()
}

func freePort() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// call sends a control API request; key "" sends none.
func (n *node) call(t *testing.T, method, path, key, body string) (int, []byte, http.Header) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, n.api+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("X-API-Key", key)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 3 * time.Minute}).Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header
}

// expect asserts a status and, for errors, the {"code","message"} body.
func (n *node) expect(t *testing.T, want int, method, path, key, body string) []byte {
	t.Helper()
	got, b, _ := n.call(t, method, path, key, body)
	if got != want {
		t.Fatalf("%s %s: status %d, want %d; body %s", method, path, got, want, b)
	}
	if want >= 400 {
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if err := json.Unmarshal(b, &e); err != nil || e.Code != want || e.Message == "" {
			t.Fatalf("%s %s: error body %s is not {\"code\": %d, \"message\": ...} (%v)", method, path, b, want, err)
		}
	}
	return b
}
