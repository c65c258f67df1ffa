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
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/aenvdtest"
	"github.com/agentenv/agentenv/cluster/redistest"
	"github.com/agentenv/agentenv/internal/testutil/guestassets"
)

// sdkDir is where .ci/setup.d/30-e2b-sdk.sh installs E2B's SDK.
const sdkVersion = "2.51.0"

// proc is a cluster process started by the test.
type proc struct {
	name string
	cmd  *exec.Cmd
	addr string
	mu   sync.Mutex
	out  bytes.Buffer
}

func (p *proc) Write(b []byte) (int, error) { p.mu.Lock(); defer p.mu.Unlock(); return p.out.Write(b) }
func (p *proc) logs() string                { p.mu.Lock(); defer p.mu.Unlock(); return p.out.String() }

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func moduleRoot() string {
	_, here, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(here), "..", "..")
}

func buildBins(t *testing.T) string {
	dir := t.TempDir()
	cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/aenv-scheduler", "./cmd/aenv-gateway", "./cmd/aenv")
	cmd.Dir = moduleRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build cluster binaries: %v\n%s", err, out)
	}
	return dir
}

func start(t *testing.T, name, bin string, args ...string) *proc {
	p := &proc{name: name, cmd: exec.Command(bin, args...)}
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
		if t.Failed() {
			t.Logf("%s log:\n%s", name, tail(p.logs(), 4000))
		}
	})
	return p
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// cluster is the whole system under test.
type cluster struct {
	bins       string
	redis      *redistest.Server
	schedulers []*proc
	gateway    string
	nodes      []*aenvdtest.Node
	names      []string
	repoDir    string // the snapshot repository the nodes share
}

func (c *cluster) call(t *testing.T, method, path, body string, hdr ...string) (int, []byte, http.Header) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, c.gateway+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", aenvdtest.Key)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := (&http.Client{Timeout: 4 * time.Minute}).Do(req)
	if err != nil {
		t.Fatalf("%s %s through the gateway: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header
}

// create makes one sandbox through the gateway.
func (c *cluster) create(t *testing.T) string {
	t.Helper()
	code, b, _ := c.call(t, "POST", "/sandboxes", `{"templateID":"base","timeout":600,"metadata":{"suite":"cluster-e2e-go"}}`)
	var s struct {
		SandboxID string `json:"sandboxID"`
	}
	if code != http.StatusCreated || json.Unmarshal(b, &s) != nil || s.SandboxID == "" {
		t.Fatalf("create through the gateway: %d %s", code, b)
	}
	return s.SandboxID
}

// where answers which node holds each id, asking every node itself but
// the ones named in skip (down).
func (c *cluster) where(t *testing.T, skip ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for i, n := range c.nodes {
		if slices.Contains(skip, c.names[i]) {
			continue
		}
		code, b, _, err := n.Call("GET", "/sandboxes", n.Key, "")
		if err != nil || code != http.StatusOK {
			t.Fatalf("list on %s: %d %v", c.names[i], code, err)
		}
		var list []struct {
			SandboxID string `json:"sandboxID"`
		}
		if err := json.Unmarshal(b, &list); err != nil {
			t.Fatal(err)
		}
		for _, s := range list {
			out[s.SandboxID] = c.names[i]
		}
	}
	return out
}

// reachable checks a sandbox answers through the gateway: its info by path
// and its agent through the proxy (E2b-Sandbox-Id header).
func (c *cluster) reachable(t *testing.T, id string) {
	t.Helper()
	if code, b, _ := c.call(t, "GET", "/sandboxes/"+id, ""); code != http.StatusOK {
		t.Fatalf("GET /sandboxes/%s through the gateway: %d %s", id, code, b)
	}
	if code, b, _ := c.call(t, "GET", "/health", "", "E2b-Sandbox-Id", id, "E2b-Sandbox-Port", "49983"); code/100 != 2 {
		t.Fatalf("the agent of %s through the gateway's proxy: %d %s", id, code, b)
	}
}

func startCluster(t *testing.T) *cluster { return startClusterWith(t, nil) }

// startClusterWith starts the cluster; schedulersOf, when set, gives the
// scheduler addresses node i dials instead of the schedulers' own (a
// forwarder the test can cut).
func startClusterWith(t *testing.T, schedulersOf func(i int, addrs []string) []string) *cluster {
	if os.Geteuid() != 0 {
		t.Skip("aenvd needs root (network namespaces, taps); CI runs as root")
	}
	guestassets.Get(t) // the agent and the guest image (cached), with clear errors
	c := &cluster{redis: redistest.Start(t)}
	bins := buildBins(t)
	c.bins = bins
	var addrs []string
	for _, id := range []string{"s1", "s2"} {
		addr := freeAddr(t)
		addrs = append(addrs, addr)
		p := start(t, "scheduler "+id, filepath.Join(bins, "aenv-scheduler"), "--listen", addr, "--redis", "redis://"+c.redis.Addr+"/0",
			"--replica-id", id, "--heartbeat-interval", "500ms", "--down-after", "5s", "--lease-ttl", "2s")
		p.addr = addr
		c.schedulers = append(c.schedulers, p)
	}
	gw := freeAddr(t)
	start(t, "gateway", filepath.Join(bins, "aenv-gateway"), "--listen", gw, "--schedulers", strings.Join(addrs, ","),
		"--domain", "localhost", "--lookup-ttl", "1ms")
	c.gateway = "http://" + gw
	c.names = []string{"node-a", "node-b", "node-c"}
	c.repoDir = t.TempDir()
	c.nodes = make([]*aenvdtest.Node, 3)
	errs := make([]error, 3)
	dials := make([][]string, 3)
	for i := range dials {
		dials[i] = addrs
		if schedulersOf != nil {
			dials[i] = schedulersOf(i, addrs)
		}
	}
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			c.nodes[i], errs[i] = aenvdtest.Start(ctx, aenvdtest.Options{Prefix: fmt.Sprintf("aclu%d", i), CIDRBase: 150 + 2*i,
				Env: []string{"AENVD_CLUSTER_SCHEDULER=" + strings.Join(dials[i], ","), "AENVD_CLUSTER_NODE_NAME=" + c.names[i],
					"AENVD_API_DOMAIN=localhost", "AENVD_REPOSITORY_BACKEND=posix", "AENVD_REPOSITORY_DIR=" + c.repoDir}})
		}()
	}
	wg.Wait()
	for i, n := range c.nodes {
		if n != nil {
			t.Cleanup(func() {
				if t.Failed() {
					t.Logf("%s log tail:\n%s", c.names[i], tail(n.Logs(), 4000))
				}
				_ = n.Close()
			})
		}
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("start %s: %v", c.names[i], err)
		}
	}
	c.waitNodes(t, 3)
	return c
}

// waitNodes waits until the gateway's /nodes shows want nodes up.
func (c *cluster) waitNodes(t *testing.T, want int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, b, _ := c.call(t, "GET", "/nodes", "")
		var nodes []struct {
			Cluster struct{ State string } `json:"cluster"`
		}
		up := 0
		if code == http.StatusOK && json.Unmarshal(b, &nodes) == nil {
			for _, n := range nodes {
				if n.Cluster.State == "up" {
					up++
				}
			}
		}
		if up == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway /nodes: %d %s; want %d nodes up", code, b, want)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// aenv runs the CLI against the gateway.
func (c *cluster) aenv(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(c.bins, "aenv"), args...)
	cmd.Env = append(os.Environ(), "AENV_URL="+c.gateway, "AENV_API_KEY="+aenvdtest.Key, "XDG_CONFIG_HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("aenv %v: %v\n%s", args, err, out)
	}
	return string(out)
}
