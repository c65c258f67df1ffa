package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/guest/codeinterp"
)

// codeInterpreterSDK is the @e2b/code-interpreter release driven against
// aenvd, and where .ci/setup.d/31-e2b-code-interpreter.sh installs it.
const (
	codeInterpreterSDK    = "2.8.0"
	codeInterpreterSDKDir = "../../guest/agent/e2e/code-interpreter-" + codeInterpreterSDK
)

// E2B's Code Interpreter SDK, unchanged: its Sandbox.create() makes the node
// build code-interpreter-v1 (first use) and start it; runCode keeps state,
// streams output, returns errors with tracebacks, PNG charts, DataFrames,
// Markdown and JSON; env vars, bash and JavaScript cells, contexts, restart,
// a timeout that interrupts the kernel, pause and resume, and a fork (the
// node's API), keeping the kernel's variables (codeinterp.mjs). The limit is generous: the first
// create builds the template (apt, a cold boot, a kernel start) under
// emulation.
func TestE2BCodeInterpreter(t *testing.T) {
	n := sharedNode(t)
	nodejs, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is not installed; the scenario needs Node.js 20+ (scripts/setup.sh installs it)")
	}
	_, here, _, _ := runtime.Caller(0)
	dir := filepath.Dir(here)
	sdkDir := filepath.Join(dir, codeInterpreterSDKDir)
	if _, err := os.Stat(filepath.Join(sdkDir, "node_modules", "@e2b", "code-interpreter", "package.json")); err != nil {
		t.Fatalf("@e2b/code-interpreter %s is not installed in %s: run .ci/setup.d/31-e2b-code-interpreter.sh", codeInterpreterSDK, sdkDir)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, nodejs, filepath.Join(dir, "codeinterp.mjs"))
	cmd.Env = append(os.Environ(), "E2B_API_URL="+n.api, "E2B_SANDBOX_URL="+n.proxy, "E2B_API_KEY="+n.key,
		"AENV_CI_SDK_DIR="+sdkDir)
	out, err := cmd.CombinedOutput()
	t.Logf("code interpreter scenario output:\n%s", out)
	if err != nil {
		t.Fatalf("code interpreter scenario failed: %v\naenvd log tail:\n%s", err, tailString(n.logs(), 6000))
	}
	if !strings.Contains(string(out), "@e2b/code-interpreter "+codeInterpreterSDK) || !strings.Contains(string(out), "code interpreter scenario passed") {
		t.Fatal("the code interpreter scenario did not run to its end")
	}
	// The template stays listed, ready, for the node's CLI and API.
	body := n.expect(t, 200, "GET", "/templates", n.key, "")
	if !strings.Contains(string(body), codeinterp.TemplateName) {
		t.Fatalf("GET /templates does not list %s: %s", codeinterp.TemplateName, body)
	}
}
