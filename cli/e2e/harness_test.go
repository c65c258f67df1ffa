package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/aenvdtest"
	"github.com/agentenv/agentenv/internal/testutil/guestassets"
	"github.com/google/go-containerregistry/pkg/registry"
)

var (
	aenvBin    string
	shared     *aenvdtest.Node
	sharedErr  error
	sharedOnce sync.Once
	// registryHost is an OCI registry (host:port, plain HTTP) the shared
	// aenvd may pull from, for the pull and build tests.
	registryHost string
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "aenv-cli-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	aenvBin = filepath.Join(dir, "aenv")
	if out, err := exec.Command("go", "build", "-o", aenvBin, "github.com/agentenv/agentenv/cmd/aenv").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build aenv: %v\n%s", err, out)
		os.Exit(1)
	}
	reg := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	registryHost = strings.TrimPrefix(reg.URL, "http://")
	code := m.Run()
	reg.Close()
	if shared != nil {
		if err := shared.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "aenvd shutdown: %v\n%s", err, shared.Logs())
			code = 1
		}
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// node starts the package's aenvd once (network prefix "clit", 10.91/10.92).
func node(t *testing.T) *aenvdtest.Node {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("aenvd needs root (network namespaces, taps); CI runs as root")
	}
	guestassets.Get(t)
	sharedOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		shared, sharedErr = aenvdtest.Start(ctx, aenvdtest.Options{Prefix: "clit", CIDRBase: 91, Env: []string{
			"AENVD_IMAGE_INSECURE_REGISTRIES=" + registryHost, "AENVD_IMAGE_ROOTFS_SIZE_MIB=256", "AENVD_IMAGE_READY_TIMEOUT=2m"}})
	})
	if sharedErr != nil {
		t.Fatalf("start aenvd: %v", sharedErr)
	}
	return shared
}

// cli runs aenv with a private HOME; env adds variables (AENV_URL...).
type cli struct {
	t    *testing.T
	home string
	env  []string
	// timeout bounds each run (default 3 minutes; builds take longer).
	timeout time.Duration
}

func newCLI(t *testing.T, env ...string) *cli {
	return &cli{t: t, home: t.TempDir(), env: env}
}

// forNode is a cli configured for n through the environment.
func forNode(t *testing.T, n *aenvdtest.Node) *cli {
	return newCLI(t, "AENV_URL="+n.API, "AENV_API_KEY="+n.Key)
}

type result struct {
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s%s", r.code, r.stdout, r.stderr, logTail())
}

// logTail is the end of aenvd's log, to explain failures.
func logTail() string {
	if shared == nil {
		return ""
	}
	l := shared.Logs()
	return "\naenvd log (tail):\n" + l[max(0, len(l)-4000):]
}

func (c *cli) runIn(stdin string, args ...string) result {
	c.t.Helper()
	limit := c.timeout
	if limit == 0 {
		limit = 3 * time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, aenvBin, args...)
	cmd.Env = append([]string{"HOME=" + c.home, "PATH=" + os.Getenv("PATH")}, c.env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		c.t.Fatalf("aenv %v: %v", args, err)
	}
	return r
}

func (c *cli) run(args ...string) result {
	c.t.Helper()
	return c.runIn("", args...)
}

// ok runs aenv and fails the test unless it exits 0.
func (c *cli) ok(args ...string) result {
	c.t.Helper()
	r := c.run(args...)
	if r.code != 0 {
		c.t.Fatalf("aenv %s: %s", strings.Join(args, " "), r)
	}
	return r
}

// fails runs aenv and asserts exit code 1 and stderr mentioning every want.
func (c *cli) fails(want []string, args ...string) result {
	c.t.Helper()
	r := c.run(args...)
	if r.code != 1 {
		c.t.Fatalf("aenv %s: want exit 1, got %s", strings.Join(args, " "), r)
	}
	for _, w := range want {
		if !strings.Contains(r.stderr, w) {
			c.t.Fatalf("aenv %s: stderr lacks %q:\n%s", strings.Join(args, " "), w, r)
		}
	}
	return r
}

// okJSON runs aenv with -o json and decodes stdout into v.
func (c *cli) okJSON(v any, args ...string) {
	c.t.Helper()
	r := c.ok(append(args, "-o", "json")...)
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		c.t.Fatalf("aenv %s -o json: %v\n%s", strings.Join(args, " "), err, r)
	}
}

// tableRows splits table output into rows of fields, checking the header.
func tableRows(t *testing.T, out string, header ...string) [][]string {
	t.Helper()
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	for _, h := range header {
		if !strings.Contains(lines[0], h) {
			t.Fatalf("table header %q lacks %q:\n%s", lines[0], h, out)
		}
	}
	var rows [][]string
	for _, l := range lines[1:] {
		rows = append(rows, strings.Fields(l))
	}
	return rows
}
