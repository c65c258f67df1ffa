// Package agentclient is a small Go client of aenv-agent's process service
// for tests of other packages (VM conformance, end-to-end): run one command
// in a sandbox and collect its output and exit code.
package agentclient

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"

	"connectrpc.com/connect"

	pb "github.com/agentenv/agentenv/guest/agent/gen/process"
	"github.com/agentenv/agentenv/guest/agent/gen/process/processconnect"
)

// Option adjusts a Run call.
type Option func(*connect.Request[pb.StartRequest])

// Run starts cmd with args through the agent at baseURL (e.g.
// "http://10.0.0.2:49983"), waits for it to end and returns its output and
// exit code. err is non-nil only when the command could not be run or the
// stream broke; a non-zero exit is reported through exitCode. hc nil means
// http.DefaultClient. The context bounds the call (and, through
// Connect-Timeout-Ms, the process inside the sandbox).
func Run(ctx context.Context, baseURL string, hc *http.Client, cmd string, args ...string) (stdout, stderr []byte, exitCode int, err error) {
	return RunWith(ctx, baseURL, hc, nil, cmd, args...)
}

// MaxMessage bounds one message the host reads from a guest's agent: a
// chunk of process output is a few KiB from a well-behaved agent; a guest
// that claims a larger message gets an error, not a buffer of that size.
const MaxMessage = 8 << 20

// NewProcessClient is the host's client of a guest's process service, with
// every message it reads bounded by MaxMessage.
func NewProcessClient(hc connect.HTTPClient, baseURL string) processconnect.ProcessClient {
	return processconnect.NewProcessClient(hc, baseURL, connect.WithReadMaxBytes(MaxMessage))
}

// RunWith is Run with request options (access token, user, env). It keeps
// at most the last 2*MaxOutput bytes of each output stream.
func RunWith(ctx context.Context, baseURL string, hc *http.Client, opts []Option, cmd string, args ...string) (stdout, stderr []byte, exitCode int, err error) {
	if hc == nil {
		hc = http.DefaultClient
	}
	client := NewProcessClient(hc, baseURL)
	stdinOff := false
	req := connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: cmd, Args: args},
		Stdin:   &stdinOff,
	})
	for _, o := range opts {
		o(req)
	}
	stream, err := client.Start(ctx, req)
	if err != nil {
		return nil, nil, -1, fmt.Errorf("start %s via %s: %w", cmd, baseURL, err)
	}
	defer stream.Close()
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			stdout = keepTail(append(stdout, d.GetStdout()...))
			stdout = keepTail(append(stdout, d.GetPty()...))
			stderr = keepTail(append(stderr, d.GetStderr()...))
		}
		if end := ev.GetEnd(); end != nil {
			return stdout, stderr, int(end.GetExitCode()), nil
		}
	}
	if err := stream.Err(); err != nil {
		return stdout, stderr, -1, fmt.Errorf("run %s via %s: %w", cmd, baseURL, err)
	}
	return stdout, stderr, -1, errors.New("run " + cmd + ": stream ended without an end event")
}

// MaxOutput bounds what RunWith keeps of each of a command's stdout and
// stderr: the last MaxOutput bytes. The guest decides how much a command
// prints, and the node runs commands of its own in guests it does not trust.
const MaxOutput = 1 << 20

// keepTail drops the front of b once it holds twice MaxOutput, keeping its
// last MaxOutput bytes (so the copy is paid once per MaxOutput bytes read).
func keepTail(b []byte) []byte {
	if len(b) <= 2*MaxOutput {
		return b
	}
	return append([]byte(nil), b[len(b)-MaxOutput:]...)
}

// WithToken sends the agent's access token.
func WithToken(token string) Option {
	return func(r *connect.Request[pb.StartRequest]) { r.Header().Set("X-Access-Token", token) }
}

// WithUser runs the command as user (Basic auth user selection).
func WithUser(user string) Option {
	return func(r *connect.Request[pb.StartRequest]) { r.Header().Set("Authorization", basic(user)) }
}

// WithEnv adds environment variables.
func WithEnv(env map[string]string) Option {
	return func(r *connect.Request[pb.StartRequest]) { r.Msg.Process.Envs = env }
}

// WithCwd sets the working directory.
func WithCwd(dir string) Option {
	return func(r *connect.Request[pb.StartRequest]) { r.Msg.Process.Cwd = &dir }
}

func basic(user string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"))
}
