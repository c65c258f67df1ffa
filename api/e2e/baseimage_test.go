package e2e

import (
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
	n := sharedNode(t)
	for i, v := range sdkVersions {
		// The template's tools are the same whatever the SDK: checked once,
		// with the newest version (they take minutes under TCG).
		tools := i == len(sdkVersions)-1
		t.Run("sdk-"+v.version, func(t *testing.T) {
			var env []string
			if tools {
				env = append(env, "AENV_BASEIMAGE_TOOLS=1")
			}
			out, err := runSDKScript(t, n, v, "baseimage.mjs", 10*time.Minute, env...)
			t.Logf("base image scenario output (SDK %s):\n%s", v.version, out)
			if err != nil {
				t.Fatalf("base image scenario with SDK %s failed: %v\naenvd log tail:\n%s", v.version, err, tailString(n.logs(), 4000))
			}
			if !strings.Contains(out, "e2b SDK "+v.version) || !strings.Contains(out, "baseimage scenario passed") ||
				tools != strings.Contains(out, "ok git, node, npm") {
				t.Fatalf("base image scenario did not run to the end with SDK %s", v.version)
			}
		})
	}
}
