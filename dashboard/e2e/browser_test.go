package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/api/aenvdtest"
	"github.com/agentenv/agentenv/internal/testutil/guestassets"
)

// chromium is Debian's browser, installed by .ci/setup.d/64-dashboard.sh.
const chromium = "/usr/bin/chromium"

// dirs returns the dashboard's web directory and the E2B SDK's.
func dirs(t *testing.T) (web, sdk string) {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	return filepath.Join(root, "dashboard", "web"), filepath.Join(root, "guest", "agent", "e2e", "sdk-2.51.0")
}

// prereqs skips without what the setup scripts install, and builds the
// front end so that the aenvd built by aenvdtest embeds it.
func prereqs(t *testing.T) (web, sdk string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("aenvd needs root (network namespaces, taps); CI runs as root")
	}
	web, sdk = dirs(t)
	for _, need := range []struct{ path, setup string }{
		{chromium, ".ci/setup.d/64-dashboard.sh"},
		{filepath.Join(web, "node_modules", "playwright-core"), ".ci/setup.d/64-dashboard.sh"},
		{filepath.Join(sdk, "node_modules", "e2b"), ".ci/setup.d/30-e2b-sdk.sh"},
	} {
		if _, err := os.Stat(need.path); err != nil {
			t.Skipf("%s is missing: run %s", need.path, need.setup)
		}
	}
	build := exec.Command("npm", "run", "--silent", "build")
	build.Dir = web
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the dashboard: %v\n%s", err, out)
	}
	guestassets.Get(t)
	return web, sdk
}

// TestDashboardInBrowser signs in, adds a webhook (to a real receiver the
// scenario runs), creates a sandbox, uses its terminal and file browser,
// pauses and resumes it and reads its state history, sees the overview's
// recent events and the webhook's deliveries, follows a template build's
// log and visits every page, all from the browser.
func TestDashboardInBrowser(t *testing.T) {
	web, sdk := prereqs(t)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	n, err := aenvdtest.Start(ctx, aenvdtest.Options{Prefix: "addash", CIDRBase: 121})
	if err != nil {
		t.Fatalf("start aenvd: %v", err)
	}
	defer func() {
		if err := n.Close(); err != nil {
			t.Errorf("aenvd shutdown: %v", err)
		}
	}()
	shots := os.Getenv("AENV_DASHBOARD_SHOTS")
	if shots == "" {
		shots = t.TempDir()
	} else if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(ctx, "node", filepath.Join(web, "e2e", "browser.mjs"))
	cmd.Dir = web
	cmd.Env = append(os.Environ(), "AENV_URL="+n.API, "AENV_API_KEY="+n.Key, "AENV_SHOTS="+shots,
		"AENV_E2B_SDK_DIR="+sdk, "AENV_BUILD=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	t.Logf("browser scenario output:\n%s\nscreenshots in %s", out.String(), shots)
	if err != nil {
		logs := n.Logs()
		t.Fatalf("browser scenario failed: %v\naenvd log tail:\n%s", err, logs[max(0, len(logs)-6000):])
	}
	if !strings.Contains(out.String(), "dashboard scenario passed") {
		t.Fatal("the browser scenario did not run to its end")
	}
	for _, name := range []string{"signin-bad-key", "overview", "sandboxes", "sandbox", "sandbox-history", "templates", "nodes", "webhooks-deliveries"} {
		if st, err := os.Stat(filepath.Join(shots, name+".png")); err != nil || st.Size() == 0 {
			t.Errorf("screenshot %s: %v", name, err)
		}
	}
}
