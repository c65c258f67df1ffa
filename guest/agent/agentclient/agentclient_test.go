package agentclient_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	pb "github.com/agentenv/agentenv/guest/agent/gen/process"

	"connectrpc.com/connect"
	"github.com/agentenv/agentenv/guest/agent"
	"github.com/agentenv/agentenv/guest/agent/agentclient"
	"github.com/agentenv/agentenv/guest/agent/gen/process/processconnect"
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

// hostileAgent answers Start with one process output message larger than
// the host reads from a guest.
type hostileAgent struct {
	processconnect.UnimplementedProcessHandler
	size int
}

func (h hostileAgent) Start(_ context.Context, _ *connect.Request[pb.StartRequest], st *connect.ServerStream[pb.StartResponse]) error {
	big := make([]byte, h.size)
	return st.Send(&pb.StartResponse{Event: &pb.ProcessEvent{Event: &pb.ProcessEvent_Data{
		Data: &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stdout{Stdout: big}}}}})
}

func TestOversizedGuestMessageIsRefused(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle(processconnect.NewProcessHandler(hostileAgent{size: agentclient.MaxMessage + 1024}))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	_, _, _, err := agentclient.RunWith(context.Background(), srv.URL, srv.Client(), nil, "/bin/true")
	if err == nil || !strings.Contains(err.Error(), "larger than configured max") {
		t.Fatalf("an oversized message from the guest: %v", err)
	}
}
