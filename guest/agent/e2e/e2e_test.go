package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// sdkVersions are the E2B SDK releases the agent must satisfy.
var sdkVersions = []string{"2.45.0", "2.51.0"}

// debugAddr is fixed by the SDK's debug mode.
const debugAddr = "127.0.0.1:49983"

const setupScript = ".ci/setup.d/30-e2b-sdk.sh"

// TestE2BSDKScenario owns port 49983: keep it the only test using it, and not parallel.
func TestE2BSDKScenario(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node is not installed; the E2B SDK scenario needs Node.js 20+ (scripts/setup.sh installs it)")
	}
	if testing.Short() {
		t.Skip("-short: skipping the E2B SDK scenario")
	}
	defaultUser, other := users(t)
	lockPort(t)
	bin := buildAgent(t)
	_, here, _, _ := runtime.Caller(0)
	dir := filepath.Dir(here)
	for _, ver := range sdkVersions {
		t.Run("sdk-"+ver, func(t *testing.T) {
			sdkDir := filepath.Join(dir, "sdk-"+ver)
			if _, err := os.Stat(filepath.Join(sdkDir, "node_modules", "e2b", "package.json")); err != nil {
				t.Fatalf("E2B SDK %s is not installed in %s: run %s (CI runs it in setup)", ver, sdkDir, setupScript)
			}
			stop := startAgent(t, bin, defaultUser)
			defer stop()
			// Not t.TempDir: its parent is private to root, and the default user must reach it.
			work, err := os.MkdirTemp("", "aenv-e2e-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(work) })
			if err := os.Chmod(work, 0o755); err != nil {
				t.Fatal(err)
			}
			runScenario(t, node, sdkDir, ver, work, defaultUser, other)
		})
	}
	// The same SDK scenario against the agent as PID 1 of a real microVM,
	// reached through its tap (init mode + services).
	t.Run("vm/sdk-"+vmSDKVersion, func(t *testing.T) {
		sdkDir := filepath.Join(dir, "sdk-"+vmSDKVersion)
		if _, err := os.Stat(filepath.Join(sdkDir, "node_modules", "e2b", "package.json")); err != nil {
			t.Fatalf("E2B SDK %s is not installed in %s: run %s", vmSDKVersion, sdkDir, setupScript)
		}
		stop := bootGuest(t)
		defer stop()
		runScenario(t, node, sdkDir, vmSDKVersion, "/tmp/e2e", "user", "root")
	})
}

// portLock serializes every run of this test on a machine (several
// checkouts may be tested at once on a shared host): port 49983 is fixed.
const portLock = "/tmp/aenv-e2e-port-49983.lock"

// lockPort takes portLock for the rest of the test, waiting up to 15 minutes.
func lockPort(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile(portLock, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatalf("open %s: %v", portLock, err)
	}
	deadline := time.Now().Add(15 * time.Minute)
	for logged := false; ; {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			t.Fatalf("lock %s: %v", portLock, err)
		}
		if !logged {
			t.Logf("another run of this test holds port 49983; waiting")
			logged = true
		}
		time.Sleep(time.Second)
	}
	t.Cleanup(func() { f.Close() }) // closing releases the lock
}

// runScenario runs scenario.mjs with one SDK version against whatever
// serves debugAddr.
func runScenario(t *testing.T, node, sdkDir, ver, work, defaultUser, other string) {
	t.Helper()
	_, here, _, _ := runtime.Caller(0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join(filepath.Dir(here), "scenario.mjs"))
	cmd.Env = append(os.Environ(),
		"E2B_DEBUG=true", "E2B_API_KEY=e2b_0000000000000000000000000000000000000000",
		"AENV_E2B_SDK_DIR="+sdkDir, "AENV_WORKDIR="+work, "AENV_DEFAULT_USER="+defaultUser, "AENV_OTHER_USER="+other)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("scenario output (SDK %s):\n%s", ver, out.String())
	if err != nil {
		t.Fatalf("scenario with SDK %s failed: %v", ver, err)
	}
	if !strings.Contains(out.String(), "e2b SDK "+ver) || !strings.Contains(out.String(), "scenario passed") {
		t.Fatalf("scenario did not run to the end with SDK %s", ver)
	}
}

// users picks the agent's default user — an unprivileged account, as E2B's
// templates default to "user" — and root as the "another user" of the scenario.
func users(t *testing.T) (defaultUser, other string) {
	if os.Geteuid() != 0 {
		t.Skip("the scenario switches users; it needs root (CI runs as root)")
	}
	for _, name := range []string{"nobody", "daemon"} {
		if _, err := user.Lookup(name); err == nil {
			return name, "root"
		}
	}
	t.Skip("no unprivileged user (nobody, daemon) on this machine")
	return "", ""
}

func buildAgent(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "aenv-agent")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/agentenv/agentenv/cmd/aenv-agent")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build aenv-agent: %v\n%s", err, out)
	}
	return bin
}

// startAgent runs the agent binary on the debug address and waits for /health.
func startAgent(t *testing.T, bin, defaultUser string) (stop func()) {
	t.Helper()
	var logs bytes.Buffer
	cmd := exec.Command(bin, "--addr", debugAddr, "--skip-init-duties", "--default-user", defaultUser)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("start agent: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	stop = func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("agent log:\n%s", logs.String())
		}
	}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-done:
			t.Fatalf("agent exited early (is port 49983 taken?): %v\n%s", err, logs.String())
		default:
		}
		resp, err := http.Get(fmt.Sprintf("http://%s/health", debugAddr))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusNoContent {
				return stop
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	t.Fatalf("agent did not become healthy on %s", debugAddr)
	return nil
}
