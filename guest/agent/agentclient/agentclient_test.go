package agentclient_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/agentenv/agentenv/guest/agent"
	"github.com/agentenv/agentenv/guest/agent/agentclient"
)

// startAgent serves a real agent on a free loopback port.
func startAgent(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = agent.ServeListener(ctx, ln, agent.New(agent.Config{SkipInitDuties: true})) }()
	return "http://" + ln.Addr().String()
}

func TestRun(t *testing.T) {
	t.Parallel()
	base := startAgent(t)
	tests := []struct {
		name           string
		script         string
		stdout, stderr string
		code           int
	}{
		{"ok", "echo hello", "hello\n", "", 0},
		{"stderr and exit code", "echo out; echo err >&2; exit 3", "out\n", "err\n", 3},
		{"no output", "true", "", "", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			out, errb, code, err := agentclient.Run(ctx, base, nil, "/bin/sh", "-c", tc.script)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if string(out) != tc.stdout || string(errb) != tc.stderr || code != tc.code {
				t.Fatalf("got stdout %q stderr %q code %d; want %q %q %d", out, errb, code, tc.stdout, tc.stderr, tc.code)
			}
		})
	}
}

func TestRunMissingCommand(t *testing.T) {
	t.Parallel()
	base := startAgent(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, _, _, err := agentclient.Run(ctx, base, nil, "/nonexistent/binary"); err == nil {
		t.Fatal("Run of a missing binary succeeded")
	}
}
