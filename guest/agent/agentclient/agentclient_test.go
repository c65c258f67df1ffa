package agentclient_test

import (
	"bytes"
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
	size  int
	count int // messages of size bytes; 0: one, and no end event
}

func (h hostileAgent) Start(_ context.Context, _ *connect.Request[pb.StartRequest], st *connect.ServerStream[pb.StartResponse]) error {
	for i := 0; i < max(h.count, 1); i++ {
		big := bytes.Repeat([]byte{byte('a' + i%26)}, h.size)
		if err := st.Send(&pb.StartResponse{Event: &pb.ProcessEvent{Event: &pb.ProcessEvent_Data{
			Data: &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stdout{Stdout: big}}}}}); err != nil {
			return err
		}
	}
	if h.count == 0 {
		return nil
	}
	return st.Send(&pb.StartResponse{Event: &pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: &pb.ProcessEvent_EndEvent{ExitCode: 0}}}})
}

// TestEndlessGuestOutputIsBounded: a guest that answers a command with
// more output than the node keeps (64 MiB here, in messages each within
// MaxMessage) costs the node at most 2*MaxOutput per stream, and the tail
// is what is kept. It used to be all kept in memory.
func TestEndlessGuestOutputIsBounded(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle(processconnect.NewProcessHandler(hostileAgent{size: 1 << 20, count: 64}))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	out, _, code, err := agentclient.RunWith(context.Background(), srv.URL, srv.Client(), nil, "/bin/true")
	if err != nil || code != 0 {
		t.Fatalf("run: code %d, %v", code, err)
	}
	if len(out) > 2*agentclient.MaxOutput || len(out) < agentclient.MaxOutput {
		t.Fatalf("kept %d bytes of 64 MiB of output, want between %d and %d", len(out), agentclient.MaxOutput, 2*agentclient.MaxOutput)
	}
	if last := byte('a' + 63%26); out[len(out)-1] != last || out[len(out)-agentclient.MaxOutput] != last {
		t.Fatalf("the kept output is not the tail: ends %q", out[len(out)-1:])
	}
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
