package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/api/aenvdtest"
)

// dashboardLists opens the gateway's dashboard in headless Chromium and
// checks its sandboxes page lists ids, which live on every node.
func dashboardLists(t *testing.T, c *cluster, ids []string) {
	web := filepath.Join(moduleRoot(), "dashboard", "web")
	for _, p := range []string{"/usr/bin/chromium", filepath.Join(web, "node_modules", "playwright-core")} {
		if _, err := os.Stat(p); err != nil {
			t.Skipf("%s is missing: run .ci/setup.d/64-dashboard.sh", p)
		}
	}
	code, b, _ := c.call(t, "GET", "/dashboard/", "")
	if code != 200 {
		t.Fatalf("GET /dashboard/ through the gateway: %d %s", code, b)
	}
	if !strings.Contains(string(b), "/dashboard/assets/") {
		t.Skip("the gateway was built before the dashboard's front end: run make build")
	}
	cmd := exec.Command("node", filepath.Join(web, "e2e", "gateway.mjs"))
	cmd.Dir = web
	cmd.Env = append(os.Environ(), "AENV_URL="+c.gateway, "AENV_API_KEY="+aenvdtest.Key,
		"AENV_IDS="+strings.Join(ids, ","), "AENV_SHOTS="+t.TempDir())
	out, err := cmd.CombinedOutput()
	t.Logf("gateway dashboard:\n%s", out)
	if err != nil || !strings.Contains(string(out), "gateway dashboard passed") {
		t.Fatalf("the gateway's sandboxes page: %v", err)
	}
}
