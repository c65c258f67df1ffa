package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/aenvdtest"
	"github.com/agentenv/agentenv/internal/testutil/guestassets"
)

// node wraps the shared aenvd process with test helpers.
type node struct {
	*aenvdtest.Node
	api, proxy, key string
	// tlsProxy is the proxy's HTTPS address (host routing under testDomain,
	// with the local CA in <data dir>/tls).
	tlsProxy string
}

// testDomain is the shared node's domain: two labels, since TLS clients
// refuse a wildcard certificate for a single-label name (*.localhost).
const testDomain = "sbx.localhost"

// loopbackPort returns a free loopback address.
func loopbackPort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

var (
	shared     *node
	sharedErr  error
	sharedOnce sync.Once
)

func TestMain(m *testing.M) {
	code := m.Run()
	for name, n := range map[string]*node{"warm pool": pooled, "flattened memory": flat} {
		if n == nil {
			continue
		}
		if err := n.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "aenvd (%s) graceful shutdown: %v\n%s\n", name, err, n.Logs())
			code = 1
		}
	}
	if shared != nil {
		// AENV_E2E_LOG keeps the whole node log for a post-mortem.
		if path := os.Getenv("AENV_E2E_LOG"); path != "" {
			_ = os.WriteFile(path, []byte(shared.Logs()), 0o644)
		}
		if err := shared.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "aenvd graceful shutdown: %v\n%s\n", err, shared.Logs())
			code = 1
		}
	}
	os.Exit(code)
}

// maxLayers is the shared node's sandbox.max_layers: low, so that the
// pause cycles of these tests merge layers too (and the crash matrix
// reaches the merge's fault points in a few rounds).
const maxLayers = 4

// sharedNode starts aenvd once per test binary (building the template once).
func sharedNode(t *testing.T) *node {
	t.Helper()
	nodePrereqs(t)
	sharedOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		var n *aenvdtest.Node
		tlsAddr, err := loopbackPort()
		if err != nil {
			sharedErr = err
			return
		}
		env := []string{"AENVD_API_DOMAIN=" + testDomain, "AENVD_API_PROXY_TLS_LISTEN=" + tlsAddr,
			fmt.Sprintf("AENVD_SANDBOX_MAX_LAYERS=%d", maxLayers),
			// Working sets are recorded and prefetched in every create.
			"AENVD_SANDBOX_PREFETCH=true",
			// Every pause and snapshot is committed to a repository too
			// (<data_dir>/repository), while the tests run.
			"AENVD_REPOSITORY_BACKEND=posix"}
		if n, sharedErr = aenvdtest.Start(ctx, aenvdtest.Options{Env: env}); sharedErr == nil {
			shared = &node{Node: n, api: n.API, proxy: n.Proxy, key: n.Key, tlsProxy: tlsAddr}
		}
	})
	if sharedErr != nil {
		t.Fatalf("start aenvd: %v", sharedErr)
	}
	return shared
}

// nodePrereqs skips a node test without root and builds what every node
// boots (the agent and the guest image, cached).
func nodePrereqs(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("aenvd needs root (network namespaces, taps); CI runs as root")
	}
	guestassets.Get(t) // with clear errors
}

func (n *node) logs() string { return n.Logs() }

// call sends a control API request; key "" sends none.
func (n *node) call(t *testing.T, method, path, key, body string) (int, []byte, http.Header) {
	t.Helper()
	code, b, h, err := n.Call(method, path, key, body)
	if err != nil {
		t.Fatal(err)
	}
	return code, b, h
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

// ownNode starts an aenvd of a test's own (a configuration the shared node
// does not have), shut down gracefully after the test's sandboxes' own
// cleanups.
func ownNode(ctx context.Context, t *testing.T, opts aenvdtest.Options) *node {
	t.Helper()
	an, err := aenvdtest.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := an.Close(); err != nil {
			t.Errorf("graceful shutdown: %v", err)
		}
	})
	return &node{Node: an, api: an.API, proxy: an.Proxy, key: an.Key}
}
