package codeinterpbench

import (
	"context"
	"encoding/json"
	"fmt"
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

// sdkDir is where .ci/setup.d/31-e2b-code-interpreter.sh installs the SDK.
const sdkDir = "../../guest/agent/e2e/code-interpreter-2.8.0"

type result struct {
	RunCode      float64 `json:"runCode"`
	CommandsRun  float64 `json:"commandsRun"`
	CreateInterp float64 `json:"createInterp"`
	CreateBase   float64 `json:"createBase"`
	Rounds       int     `json:"rounds"`
}

// BenchmarkCodeInterpreter prints the medians of run.mjs and their ratios
// to the references measured in the same run and sandbox.
func BenchmarkCodeInterpreter(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("aenvd needs root")
	}
	guestassets.Get(b)
	nodejs, err := exec.LookPath("node")
	if err != nil {
		b.Fatal("node is not installed (scripts/setup.sh installs it)")
	}
	_, here, _, _ := runtime.Caller(0)
	dir := filepath.Dir(here)
	sdk := filepath.Join(dir, sdkDir)
	if _, err := os.Stat(filepath.Join(sdk, "node_modules", "@e2b", "code-interpreter")); err != nil {
		b.Fatalf("@e2b/code-interpreter is not installed in %s: run .ci/setup.d/31-e2b-code-interpreter.sh", sdk)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	n, err := aenvdtest.Start(ctx, aenvdtest.Options{Prefix: "abinterp", CIDRBase: 93})
	if err != nil {
		b.Fatal(err)
	}
	defer n.Close()
	for i := 0; i < b.N; i++ {
		cmd := exec.CommandContext(ctx, nodejs, filepath.Join(dir, "run.mjs"))
		cmd.Env = append(os.Environ(), "E2B_API_URL="+n.API, "E2B_SANDBOX_URL="+n.Proxy, "E2B_API_KEY="+n.Key,
			"AENV_CI_SDK_DIR="+sdk)
		out, err := cmd.Output()
		if err != nil {
			b.Fatalf("run.mjs: %v\n%s\naenvd log tail:\n%s", err, out, tail(n.Logs(), 4000))
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		var r result
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
			b.Fatalf("run.mjs printed %q: %v", out, err)
		}
		fmt.Printf("runCode(\"1+1\") median %.1f ms, commands.run(\"true\") median %.1f ms (%d rounds, one sandbox): ratio %.2fx\n",
			r.RunCode, r.CommandsRun, r.Rounds, r.RunCode/r.CommandsRun)
		fmt.Printf("create code-interpreter-v1 median %.0f ms, create base median %.0f ms (3 each): ratio %.2fx\n",
			r.CreateInterp, r.CreateBase, r.CreateInterp/r.CreateBase)
		b.ReportMetric(r.RunCode/r.CommandsRun, "runCode/commands.run")
		b.ReportMetric(r.CreateInterp/r.CreateBase, "create-interp/create-base")
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
