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
)

// TestBaseImage checks, through each E2B SDK version, what users of E2B's
// base image rely on in a sandbox of the default template (baseimage.mjs):
// the user `user` with home /home/user and passwordless sudo, git, Node.js
// with npm, python3 with pip and venv, gcc/g++/make, free disk space, and
// git operations through sbx.git. The tools are checked with one SDK version
// only: they are the template's, and take minutes under TCG.
func TestBaseImage(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is not installed; the E2B SDK scenario needs Node.js 20+ (scripts/setup.sh installs it)")
	}
	n := sharedNode(t)
	_, here, _, _ := runtime.Caller(0)
	dir := filepath.Dir(here)
	for i, v := range sdkVersions {
		// The template's tools are the same whatever the SDK: checked once,
		// with the newest version (they take minutes under TCG).
		tools := i == len(sdkVersions)-1
		t.Run("sdk-"+v.version, func(t *testing.T) {
			sdkDir := filepath.Join(dir, v.dir, "sdk-"+v.version)
			if _, err := os.Stat(filepath.Join(sdkDir, "node_modules", "e2b", "package.json")); err != nil {
				t.Fatalf("E2B SDK %s is not installed in %s: run %s", v.version, sdkDir, v.setup)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, node, filepath.Join(dir, "baseimage.mjs"))
			cmd.Env = append(os.Environ(), "E2B_API_URL="+n.api, "E2B_SANDBOX_URL="+n.proxy, "E2B_API_KEY="+n.key,
				"AENV_E2B_SDK_DIR="+sdkDir)
			if tools {
				cmd.Env = append(cmd.Env, "AENV_BASEIMAGE_TOOLS=1")
			}
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			err := cmd.Run()
			t.Logf("base image scenario output (SDK %s):\n%s", v.version, out.String())
			if err != nil {
				t.Fatalf("base image scenario with SDK %s failed: %v\naenvd log tail:\n%s", v.version, err, tailString(n.logs(), 4000))
			}
			if !strings.Contains(out.String(), "e2b SDK "+v.version) || !strings.Contains(out.String(), "baseimage scenario passed") ||
				tools != strings.Contains(out.String(), "ok git, node, npm") {
				t.Fatalf("base image scenario did not run to the end with SDK %s", v.version)
			}
		})
	}
}
