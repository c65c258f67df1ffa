package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

type sdkVersion struct {
	version    string
	dir        string
	setup      string
	concurrent int
}

// sdkVersions are the E2B npm SDK releases run against aenvd (2.45 and 2.50
// use the v1 create/connect paths, 2.51 the v2 ones), where each is installed
// (relative to this directory) and how many extra sandboxes it creates
// concurrently.
var sdkVersions = []sdkVersion{
	{"2.45.0", "../../guest/agent/e2e", ".ci/setup.d/30-e2b-sdk.sh", 5},
	{"2.50.0", ".", ".ci/setup.d/40-aenvd-sdk.sh", 5},
	{"2.51.0", "../../guest/agent/e2e", ".ci/setup.d/30-e2b-sdk.sh", 5},
}

func TestE2BSDK(t *testing.T) {
	n := sharedNode(t)
	for _, v := range sdkVersions {
		t.Run("sdk-"+v.version, func(t *testing.T) {
			env := []string{"AENV_CONCURRENT=" + strconv.Itoa(v.concurrent),
				"AENV_TLS_PROXY=" + n.tlsProxy, "AENV_TLS_CA=" + filepath.Join(n.DataDir, "tls", "ca.pem")}
			out, err := runSDKScript(t, n, v, "scenario.mjs", 6*time.Minute, env...)
			t.Logf("scenario output (SDK %s):\n%s", v.version, out)
			if err != nil {
				t.Fatalf("scenario with SDK %s failed: %v\naenvd log tail:\n%s", v.version, err, tailString(n.logs(), 6000))
			}
			if !strings.Contains(out, "e2b SDK "+v.version) || !strings.Contains(out, "scenario passed") {
				t.Fatalf("scenario did not run to the end with SDK %s", v.version)
			}
		})
	}
}

// sdkScenario is a script run with every SDK version (eachSDK).
type sdkScenario struct {
	script, name string // name: its last line is "<name> scenario passed"
	limit        time.Duration
	// lastEnv is added for the newest version only (slow checks that need
	// one run); lastStep is a step that must run with it and only with it.
	lastEnv  []string
	lastStep string
}

// eachSDK runs sc with every SDK version, each as a subtest, and checks it
// ran to its end.
func eachSDK(t *testing.T, n *node, sc sdkScenario) {
	for i, v := range sdkVersions {
		t.Run("sdk-"+v.version, func(t *testing.T) {
			last := i == len(sdkVersions)-1
			var env []string
			if last {
				env = sc.lastEnv
			}
			out, err := runSDKScript(t, n, v, sc.script, sc.limit, env...)
			t.Logf("%s scenario output (SDK %s):\n%s", sc.name, v.version, out)
			if err != nil {
				t.Fatalf("%s scenario with SDK %s failed: %v\naenvd log tail:\n%s", sc.name, v.version, err, tailString(n.logs(), 4000))
			}
			if !strings.Contains(out, "e2b SDK "+v.version) || !strings.Contains(out, sc.name+" scenario passed") ||
				sc.lastStep != "" && last != strings.Contains(out, "ok "+sc.lastStep) {
				t.Fatalf("%s scenario did not run to the end with SDK %s", sc.name, v.version)
			}
		})
	}
}

// runSDKScript runs script (a Node.js file next to this one) with E2B's SDK
// of version v pointed at node n, within limit, and returns its output.
func runSDKScript(t *testing.T, n *node, v sdkVersion, script string, limit time.Duration, env ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	cmd := sdkCommand(ctx, t, n, v, script, env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// sdkCommand is the command that runs script with E2B's SDK of version v
// pointed at node n; it fails the test if Node.js or that SDK is missing.
func sdkCommand(ctx context.Context, t *testing.T, n *node, v sdkVersion, script string, env ...string) *exec.Cmd {
	t.Helper()
	nodejs, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is not installed; the E2B SDK scenario needs Node.js 20+ (scripts/setup.sh installs it)")
	}
	_, here, _, _ := runtime.Caller(0)
	dir := filepath.Dir(here)
	sdkDir := filepath.Join(dir, v.dir, "sdk-"+v.version)
	if _, err := os.Stat(filepath.Join(sdkDir, "node_modules", "e2b", "package.json")); err != nil {
		t.Fatalf("E2B SDK %s is not installed in %s: run %s", v.version, sdkDir, v.setup)
	}
	cmd := exec.CommandContext(ctx, nodejs, filepath.Join(dir, script))
	cmd.Env = append(append(os.Environ(), "E2B_API_URL="+n.api, "E2B_SANDBOX_URL="+n.proxy, "E2B_API_KEY="+n.key,
		"AENV_E2B_SDK_DIR="+sdkDir), env...)
	return cmd
}

func tailString(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
