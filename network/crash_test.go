package network_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/network"
	"github.com/agentenv/agentenv/network/nettest"
)

const (
	crashPrefixEnv = "AENV_NETTEST_CRASH_PREFIX"
	crashHostEnv   = "AENV_NETTEST_CRASH_HOSTNS"
)

// TestCrashHelper is the process that gets killed: it allocates slots
// forever. It only runs when TestCrashCleanup starts it.
func TestCrashHelper(t *testing.T) {
	prefix := os.Getenv(crashPrefixEnv)
	if prefix == "" {
		t.Skip("helper process of TestCrashCleanup")
	}
	m, err := network.New(context.Background(), network.Config{
		Prefix: prefix, HostNetNS: os.Getenv(crashHostEnv), GuestNetNS: true, PoolLow: 2, PoolHigh: 4,
	})
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(2)
	}
	for i := 0; ; i++ {
		if _, err := m.Acquire(context.Background()); err != nil {
			fmt.Println("ERROR", err)
			os.Exit(2)
		}
		if i == 2 {
			fmt.Println("READY")
		}
	}
}

func TestCrashCleanup(t *testing.T) {
	t.Parallel()
	nettest.RequireRoot(t)
	w := nettest.NewWorld(t, nettest.Prefix())
	cfg := w.Config()
	t.Cleanup(func() { network.Cleanup(context.Background(), cfg) })

	cmd, line := startHelper(t, "TestCrashHelper", []string{crashPrefixEnv + "=" + cfg.Prefix, crashHostEnv + "=" + cfg.HostNetNS},
		func(l string) bool { return l == "READY" })
	if line != "READY" {
		t.Fatalf("helper: %s", line)
	}
	// Kill it while it is in the middle of building slots.
	time.Sleep(3 * time.Millisecond)
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()

	left, err := nettest.Leftovers(cfg.Prefix, cfg.HostNetNS)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) < 4 {
		t.Fatalf("the killed helper left only %v: the test would prove nothing", left)
	}
	t.Logf("killed helper left %d objects", len(left))

	// A new manager with the same prefix starts clean and works.
	m, err := network.New(t.Context(), cfg)
	if err != nil {
		t.Fatalf("New after crash: %v", err)
	}
	s, err := m.Acquire(t.Context())
	if err != nil {
		t.Fatalf("Acquire after crash: %v", err)
	}
	if s.Index != 1 {
		t.Errorf("first slot after restart has index %d, want 1", s.Index)
	}
	if err := m.Shutdown(context.Background()); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	left, err = nettest.Leftovers(cfg.Prefix, cfg.HostNetNS)
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		t.Fatalf("left after restart and shutdown: %v", left)
	}

	// Cleanup alone removes a crash's leftovers too.
	if err := network.CreateNamedNetNS(cfg.Prefix + "-77"); err != nil {
		t.Fatal(err)
	}
	if n, err := network.Cleanup(t.Context(), cfg); err != nil || n != 1 {
		t.Fatalf("Cleanup = %d, %v; want 1 object removed", n, err)
	}
}

// startHelper runs the test named helper of this binary as a separate
// process (killed at cleanup) and returns it with the first line of its
// output that want accepts or that starts with ERROR ("helper exited" if
// none came, a failure after 30 s).
func startHelper(t *testing.T, helper string, env []string, want func(string) bool) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+helper+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	got := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if l := sc.Text(); want(l) || strings.HasPrefix(l, "ERROR") {
				got <- l
				return
			}
		}
		got <- "helper exited"
	}()
	select {
	case l := <-got:
		return cmd, l
	case <-time.After(30 * time.Second):
		t.Fatalf("helper %s did not get ready", helper)
		return nil, ""
	}
}
