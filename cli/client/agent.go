package client

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"connectrpc.com/connect"

	"github.com/agentenv/agentenv/guest/agent/agentclient"
	pb "github.com/agentenv/agentenv/guest/agent/gen/process"
	"github.com/agentenv/agentenv/guest/agent/gen/process/processconnect"
)

// AgentPort is the in-sandbox agent's port, named in E2b-Sandbox-Port.
const AgentPort = "49983"

// Sandbox reaches one sandbox's agent through the node's proxy.
type Sandbox struct {
	ID    string
	Token string // envdAccessToken, "" if none
	User  string // "" for the template's default user
	c     *Client
	hc    *http.Client
}

// Sandbox returns a handle on the agent of sandbox id.
func (c *Client) Sandbox(id, token, user string) *Sandbox {
	s := &Sandbox{ID: id, Token: token, User: user, c: c}
	base := c.HTTP.Transport
	if base == nil {
		base = http.DefaultTransport
	}
	s.hc = &http.Client{Transport: routing{s: s, next: base}}
	return s
}

// routing adds the proxy's routing headers and the agent's credentials.
type routing struct {
	s    *Sandbox
	next http.RoundTripper
}

func (r routing) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set("E2b-Sandbox-Id", r.s.ID)
	req.Header.Set("E2b-Sandbox-Port", AgentPort)
	if r.s.Token != "" {
		req.Header.Set("X-Access-Token", r.s.Token)
	}
	if r.s.User != "" && req.Header.Get("Authorization") == "" {
		req.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(r.s.User+":")))
	}
	return r.next.RoundTrip(req)
}

func (s *Sandbox) proc() processconnect.ProcessClient {
	return agentclient.NewProcessClient(s.hc, s.c.BaseURL)
}

func (s *Sandbox) agentError(op string, err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) && (ce.Code() == connect.CodeUnavailable || ce.Code() == connect.CodeUnknown) {
		return fmt.Errorf("%s in sandbox %s: %w (is the sandbox running? see `aenv list`; a paused one needs `aenv resume %s`)", op, s.ID, err, s.ID)
	}
	return fmt.Errorf("%s in sandbox %s: %w", op, s.ID, err)
}

// Command is a process to run in a sandbox.
type Command struct {
	Argv []string          // run as is (no shell), found in the login shell's PATH
	Env  map[string]string // extra environment
	Cwd  string
}

// loginExec wraps argv so that it runs with a login shell's environment
// (PATH, HOME) but without shell parsing of the arguments.
func loginExec(argv []string) (string, []string) {
	return "/bin/bash", append([]string{"-l", "-c", `exec "$@"`, "aenv-exec"}, argv...)
}

// Exec runs cmd, streaming its output to stdout and stderr, with stdin (if
// not nil) copied to the process. It returns the process's exit code.
func (s *Sandbox) Exec(ctx context.Context, cmd Command, stdin io.Reader, stdout, stderr io.Writer) (int, error) {
	name, args := loginExec(cmd.Argv)
	useStdin := stdin != nil
	req := connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: name, Args: args, Envs: cmd.Env},
		Stdin:   &useStdin,
	})
	if cmd.Cwd != "" {
		req.Msg.Process.Cwd = &cmd.Cwd
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := s.proc().Start(ctx, req)
	if err != nil {
		return -1, s.agentError("start "+cmd.Argv[0], err)
	}
	defer stream.Close()
	var pid uint32
	defer func() { s.stopIfCancelled(ctx, pid, pb.Signal_SIGNAL_SIGTERM) }()
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		switch {
		case ev.GetStart() != nil:
			pid = ev.GetStart().GetPid()
			if useStdin {
				go s.feed(ctx, pid, stdin, false)
			}
		case ev.GetData() != nil:
			d := ev.GetData()
			if _, err := stdout.Write(d.GetStdout()); err != nil {
				return -1, fmt.Errorf("write output of %s: %w", cmd.Argv[0], err)
			}
			_, _ = stdout.Write(d.GetPty())
			_, _ = stderr.Write(d.GetStderr())
		case ev.GetEnd() != nil:
			end := ev.GetEnd()
			if end.Error != nil && *end.Error != "" && !end.GetExited() {
				return int(end.GetExitCode()), fmt.Errorf("run %s in sandbox %s: %s", cmd.Argv[0], s.ID, *end.Error)
			}
			pid = 0
			return int(end.GetExitCode()), nil
		}
	}
	if err := stream.Err(); err != nil {
		return -1, s.agentError("run "+cmd.Argv[0], err)
	}
	return -1, fmt.Errorf("run %s in sandbox %s: the output stream ended without an exit status", cmd.Argv[0], s.ID)
}

// stopIfCancelled signals process pid (and its group) when ctx was
// cancelled before it ended: the agent keeps processes whose client went
// away, and an interrupted aenv must not leave them behind.
func (s *Sandbox) stopIfCancelled(ctx context.Context, pid uint32, sig pb.Signal) {
	if pid == 0 || ctx.Err() == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	_, _ = s.proc().SendSignal(ctx, connect.NewRequest(&pb.SendSignalRequest{Process: sel, Signal: sig}))
}

// feed copies r to the process's stdin (or pty) and closes stdin at EOF.
func (s *Sandbox) feed(ctx context.Context, pid uint32, r io.Reader, pty bool) {
	sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
	buf := make([]byte, 32*1024)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			in := &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: append([]byte(nil), buf[:n]...)}}
			if pty {
				in = &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: append([]byte(nil), buf[:n]...)}}
			}
			if _, serr := s.proc().SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: in})); serr != nil {
				return
			}
		}
		if err != nil {
			if pty {
				// End of piped input: Ctrl-D, which a program reading the pty
				// takes as EOF. A Ctrl-D that arrives while the shell is still
				// starting (cooked mode) can be lost, so repeat it every second
				// until the process ends (Terminal cancels ctx then).
				eof := &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: []byte{4}}}
				for {
					if _, err := s.proc().SendInput(ctx, connect.NewRequest(&pb.SendInputRequest{Process: sel, Input: eof})); err != nil {
						return
					}
					select {
					case <-ctx.Done():
						return
					case <-time.After(time.Second):
					}
				}
			} else {
				_, _ = s.proc().CloseStdin(ctx, connect.NewRequest(&pb.CloseStdinRequest{Process: sel}))
			}
			return
		}
	}
}

// filesURL is the agent's /files endpoint for path.
func (s *Sandbox) filesURL(path string) string {
	q := url.Values{"path": {path}}
	if s.User != "" {
		q.Set("username", s.User)
	}
	return s.c.BaseURL + "/files?" + q.Encode()
}

// Upload writes r (size bytes, -1 if unknown) to path in the sandbox.
func (s *Sandbox) Upload(ctx context.Context, path string, r io.Reader, size int64) error {
	req, err := http.NewRequestWithContext(ctx, "POST", s.filesURL(path), r)
	if err != nil {
		return fmt.Errorf("upload to %s in sandbox %s: %w", path, s.ID, err)
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := s.hc.Do(req)
	if err != nil {
		return s.c.transportError("upload to "+path+" in sandbox "+s.ID, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return s.fileError("upload to "+path, resp)
	}
	return nil
}

// Download opens path in the sandbox; size is -1 if unknown.
func (s *Sandbox) Download(ctx context.Context, path string) (rc io.ReadCloser, size int64, err error) {
	req, err := http.NewRequestWithContext(ctx, "GET", s.filesURL(path), nil)
	if err != nil {
		return nil, 0, fmt.Errorf("download %s from sandbox %s: %w", path, s.ID, err)
	}
	resp, err := s.hc.Do(req)
	if err != nil {
		return nil, 0, s.c.transportError("download "+path+" from sandbox "+s.ID, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, 0, s.fileError("download "+path, resp)
	}
	return resp.Body, resp.ContentLength, nil
}

func (s *Sandbox) fileError(op string, resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	msg := string(b)
	var e struct {
		Message string `json:"message"`
	}
	if jsonErr := jsonUnmarshal(b, &e); jsonErr == nil && e.Message != "" {
		msg = e.Message
	}
	hint := ""
	switch resp.StatusCode {
	case http.StatusBadGateway:
		hint = fmt.Sprintf(" (sandbox %s is not running: see `aenv list`; resume a paused one with `aenv resume %s`)", s.ID, s.ID)
	case http.StatusNotFound:
		hint = " (check the path)"
	case http.StatusUnauthorized, http.StatusForbidden:
		hint = " (the sandbox's access token was refused)"
	}
	return fmt.Errorf("%s in sandbox %s: agent answered %d: %s%s", op, s.ID, resp.StatusCode, msg, hint)
}
