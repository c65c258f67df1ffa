package procsvc_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/agentenv/agentenv/guest/agent/agenttest"
	pb "github.com/agentenv/agentenv/guest/agent/gen/process"
	"github.com/agentenv/agentenv/guest/agent/gen/process/processconnect"
)

// clients returns a proto and a JSON (what E2B's JS SDK uses) client.
func clients(t *testing.T) (*agenttest.Server, map[string]processconnect.ProcessClient) {
	t.Helper()
	srv := agenttest.Start(t)
	return srv, map[string]processconnect.ProcessClient{
		"proto": processconnect.NewProcessClient(agenttest.Client, srv.URL),
		"json":  processconnect.NewProcessClient(agenttest.Client, srv.URL, connect.WithProtoJSON()),
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func shell(script string) *pb.ProcessConfig {
	return &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", script}}
}

// result is what a stream delivered.
type result struct {
	pid        uint32
	stdout     string
	stderr     string
	pty        string
	end        *pb.ProcessEvent_EndEvent
	keepalives int
	order      []string
}

type eventStream interface {
	Receive() bool
	Err() error
}

// collect reads events until the end event or the stream's end.
func collect[T interface{ GetEvent() *pb.ProcessEvent }](s interface {
	Receive() bool
	Msg() T
	Err() error
}) (result, error) {
	var r result
	for s.Receive() {
		ev := s.Msg().GetEvent()
		switch {
		case ev.GetStart() != nil:
			r.pid = ev.GetStart().GetPid()
			r.order = append(r.order, "start")
		case ev.GetData() != nil:
			d := ev.GetData()
			r.stdout += string(d.GetStdout())
			r.stderr += string(d.GetStderr())
			r.pty += string(d.GetPty())
			r.order = append(r.order, "data")
		case ev.GetKeepalive() != nil:
			r.keepalives++
		case ev.GetEnd() != nil:
			r.end = ev.GetEnd()
			r.order = append(r.order, "end")
			return r, nil
		}
	}
	return r, s.Err()
}

func TestStartOutputAndExitCodes(t *testing.T) {
	t.Parallel()
	_, cs := clients(t)
	tests := []struct {
		name           string
		script         string
		stdout, stderr string
		code           int32
		exited         bool
	}{
		{"stdout", "echo hello", "hello\n", "", 0, true},
		{"stderr and code", "echo out; echo err >&2; exit 42", "out\n", "err\n", 42, true},
		{"large output", "head -c 300000 /dev/zero | tr '\\0' a", strings.Repeat("a", 300000), "", 0, true},
		{"killed by signal", "kill -9 $$", "", "", -1, false},
	}
	for codec, c := range cs {
		for _, tc := range tests {
			t.Run(codec+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				s, err := c.Start(ctxT(t), connect.NewRequest(&pb.StartRequest{Process: shell(tc.script)}))
				if err != nil {
					t.Fatal(err)
				}
				defer s.Close()
				r, err := collect(s)
				if err != nil {
					t.Fatal(err)
				}
				if r.order[0] != "start" || r.pid == 0 {
					t.Fatalf("first event is %v (pid %d), want start with a pid", r.order, r.pid)
				}
				if r.end == nil {
					t.Fatal("no end event")
				}
				if r.stdout != tc.stdout || r.stderr != tc.stderr {
					t.Fatalf("stdout %q stderr %q, want %q %q", trunc(r.stdout), r.stderr, trunc(tc.stdout), tc.stderr)
				}
				if r.end.GetExitCode() != tc.code || r.end.GetExited() != tc.exited {
					t.Fatalf("end %v, want code %d exited %v", r.end, tc.code, tc.exited)
				}
				if tc.code != 0 && r.end.GetStatus() == "" {
					t.Fatalf("end has no status: %v", r.end)
				}
			})
		}
	}
}

func trunc(s string) string {
	if len(s) > 40 {
		return s[:40] + fmt.Sprintf("...(%d bytes)", len(s))
	}
	return s
}

func TestStartEnvCwdAndDefaults(t *testing.T) {
	t.Parallel()
	srv, cs := clients(t)
	c := cs["json"]
	dir := t.TempDir()
	cfg := shell(`printf '%s|%s|%s|%s' "$FOO" "$(pwd)" "$HOME" "$USER"`)
	cfg.Envs = map[string]string{"FOO": "bar baz"}
	cfg.Cwd = &dir
	r := run(t, c, &pb.StartRequest{Process: cfg})
	want := fmt.Sprintf("bar baz|%s|%s|tester", dir, srv.Home)
	if r.stdout != want {
		t.Fatalf("got %q, want %q", r.stdout, want)
	}
	// Without cwd, the process starts in the user's home.
	r = run(t, c, &pb.StartRequest{Process: shell("pwd")})
	if strings.TrimSpace(r.stdout) != srv.Home {
		t.Fatalf("default cwd %q, want home %q", r.stdout, srv.Home)
	}
	// A relative cwd resolves against the home.
	if err := os.Mkdir(filepath.Join(srv.Home, "proj"), 0o755); err != nil {
		t.Fatal(err)
	}
	rel := "proj"
	r = run(t, c, &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "pwd", Cwd: &rel}})
	if strings.TrimSpace(r.stdout) != filepath.Join(srv.Home, "proj") {
		t.Fatalf("relative cwd gave %q", r.stdout)
	}
}

func TestStartErrors(t *testing.T) {
	t.Parallel()
	_, cs := clients(t)
	c := cs["json"]
	missing := "/does/not/exist"
	tests := []struct {
		name string
		req  *pb.StartRequest
		code connect.Code
	}{
		{"empty cmd", &pb.StartRequest{Process: &pb.ProcessConfig{}}, connect.CodeInvalidArgument},
		{"missing binary", &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/no/such/binary"}}, connect.CodeInternal},
		{"binary not in PATH", &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "no-such-binary-aenv"}}, connect.CodeNotFound},
		{"missing cwd", &pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "true", Cwd: &missing}}, connect.CodeInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := c.Start(ctxT(t), connect.NewRequest(tc.req))
			if err == nil {
				_, err = collect(s)
				s.Close()
			}
			if connect.CodeOf(err) != tc.code {
				t.Fatalf("error %v (code %v), want code %v", err, connect.CodeOf(err), tc.code)
			}
		})
	}
	t.Run("unknown user", func(t *testing.T) {
		req := connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "true"}})
		req.Header().Set("Authorization", basic("no-such-user-aenv"))
		s, err := c.Start(ctxT(t), req)
		if err == nil {
			_, err = collect(s)
		}
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Fatalf("error %v, want invalid_argument", err)
		}
	})
}

func basic(user string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"))
}

func run(t *testing.T, c processconnect.ProcessClient, req *pb.StartRequest) result {
	t.Helper()
	return runReq(t, c, connect.NewRequest(req))
}

func runReq(t *testing.T, c processconnect.ProcessClient, req *connect.Request[pb.StartRequest]) result {
	t.Helper()
	s, err := c.Start(ctxT(t), req)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r, err := collect(s)
	if err != nil {
		t.Fatal(err)
	}
	if r.end == nil {
		t.Fatal("no end event")
	}
	return r
}

func TestSupplementaryGroups(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("switching users needs root")
	}
	home, err := os.MkdirTemp("", "aenv-home-") // t.TempDir's parent is private to root
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(home) })
	os.Chmod(home, 0o755)
	srv := agenttest.StartWith(t, fmt.Sprintf("aenvgrp:x:64000:64000::%s:/bin/sh\n", home), "aenvprimary:x:64000:\naenvextra:x:64001:other,aenvgrp\n")
	c := processconnect.NewProcessClient(agenttest.Client, srv.URL)
	req := connect.NewRequest(&pb.StartRequest{Process: shell("id -u; id -g; id -G; echo $HOME; pwd")})
	req.Header().Set("Authorization", basic("aenvgrp"))
	r := runReq(t, c, req)
	want := fmt.Sprintf("64000\n64000\n64000 64001\n%s\n%s\n", home, home)
	if r.stdout != want {
		t.Fatalf("got %q, want %q (stderr %q)", r.stdout, want, r.stderr)
	}
}

func TestUserSwitching(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("switching users needs root")
	}
	_, cs := clients(t)
	req := connect.NewRequest(&pb.StartRequest{Process: shell("id -u; id -g; echo $USER $HOME")})
	req.Header().Set("Authorization", basic("nobody"))
	r := runReq(t, cs["json"], req)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 || lines[0] != "65534" || !strings.HasPrefix(lines[2], "nobody ") {
		t.Fatalf("as nobody got %q", r.stdout)
	}
}

// startBackground starts a process and returns its pid and the stream, which
// the caller may drop.
func startBackground(t *testing.T, c processconnect.ProcessClient, req *pb.StartRequest) (uint32, *connect.ServerStreamForClient[pb.StartResponse], context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s, err := c.Start(ctx, connect.NewRequest(req))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if !s.Receive() || s.Msg().GetEvent().GetStart() == nil {
		cancel()
		t.Fatalf("no start event: %v", s.Err())
	}
	return s.Msg().GetEvent().GetStart().GetPid(), s, cancel
}

func pidSel(pid uint32) *pb.ProcessSelector {
	return &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
}

func tagSel(tag string) *pb.ProcessSelector {
	return &pb.ProcessSelector{Selector: &pb.ProcessSelector_Tag{Tag: tag}}
}

func TestStdinSendInputAndCloseStdin(t *testing.T) {
	t.Parallel()
	_, cs := clients(t)
	for codec, c := range cs {
		t.Run(codec, func(t *testing.T) {
			t.Parallel()
			pid, s, cancel := startBackground(t, c, &pb.StartRequest{Process: shell("cat; echo done")})
			defer cancel()
			for _, chunk := range []string{"one ", "two\n"} {
				_, err := c.SendInput(ctxT(t), connect.NewRequest(&pb.SendInputRequest{Process: pidSel(pid), Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte(chunk)}}}))
				if err != nil {
					t.Fatal(err)
				}
			}
			if _, err := c.CloseStdin(ctxT(t), connect.NewRequest(&pb.CloseStdinRequest{Process: pidSel(pid)})); err != nil {
				t.Fatal(err)
			}
			r, err := collect(s)
			if err != nil {
				t.Fatal(err)
			}
			if r.stdout != "one two\ndone\n" || r.end.GetExitCode() != 0 {
				t.Fatalf("got %q end %v", r.stdout, r.end)
			}
		})
	}
}

func TestStdinDisabled(t *testing.T) {
	t.Parallel()
	_, cs := clients(t)
	c := cs["proto"]
	off := false
	// With stdin off the child reads EOF at once instead of waiting.
	r := run(t, c, &pb.StartRequest{Process: shell("cat; echo eof"), Stdin: &off})
	if r.stdout != "eof\n" {
		t.Fatalf("got %q", r.stdout)
	}
	pid, _, cancel := startBackground(t, c, &pb.StartRequest{Process: shell("sleep 30"), Stdin: &off})
	defer cancel()
	defer c.SendSignal(context.Background(), connect.NewRequest(&pb.SendSignalRequest{Process: pidSel(pid), Signal: pb.Signal_SIGNAL_SIGKILL}))
	_, err := c.SendInput(ctxT(t), connect.NewRequest(&pb.SendInputRequest{Process: pidSel(pid), Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("x")}}}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("SendInput without stdin: %v, want failed_precondition", err)
	}
}

func TestStreamInput(t *testing.T) {
	t.Parallel()
	srv, _ := clients(t)
	// Client streams need HTTP/2; the agent serves cleartext HTTP/2 too.
	c := processconnect.NewProcessClient(h2cClient(), srv.URL)
	pid, s, cancel := startBackground(t, c, &pb.StartRequest{Process: shell("head -n 3")})
	defer cancel()
	in := c.StreamInput(ctxT(t))
	send := func(m *pb.StreamInputRequest) {
		if err := in.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	send(&pb.StreamInputRequest{Event: &pb.StreamInputRequest_Start{Start: &pb.StreamInputRequest_StartEvent{Process: pidSel(pid)}}})
	for i := range 3 {
		send(&pb.StreamInputRequest{Event: &pb.StreamInputRequest_Data{Data: &pb.StreamInputRequest_DataEvent{Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte(fmt.Sprintf("line%d\n", i))}}}}})
	}
	send(&pb.StreamInputRequest{Event: &pb.StreamInputRequest_Keepalive{Keepalive: &pb.StreamInputRequest_KeepAlive{}}})
	if _, err := in.CloseAndReceive(); err != nil {
		t.Fatal(err)
	}
	r, err := collect(s)
	if err != nil {
		t.Fatal(err)
	}
	if r.stdout != "line0\nline1\nline2\n" {
		t.Fatalf("got %q", r.stdout)
	}
}

func TestPTY(t *testing.T) {
	t.Parallel()
	_, cs := clients(t)
	c := cs["json"]
	pid, s, cancel := startBackground(t, c, &pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "/bin/sh", Envs: map[string]string{"PS1": "$ "}},
		Pty:     &pb.PTY{Size: &pb.PTY_Size{Cols: 80, Rows: 24}},
	})
	defer cancel()
	send := func(text string) {
		t.Helper()
		_, err := c.SendInput(ctxT(t), connect.NewRequest(&pb.SendInputRequest{Process: pidSel(pid), Input: &pb.ProcessInput{Input: &pb.ProcessInput_Pty{Pty: []byte(text)}}}))
		if err != nil {
			t.Fatal(err)
		}
	}
	send("stty size; tty >/dev/null && echo is-a-$((1+1))tty\n")
	var out strings.Builder
	for !strings.Contains(out.String(), "is-a-2tty") {
		if !s.Receive() {
			t.Fatalf("stream ended early: %v (output %q)", s.Err(), out.String())
		}
		out.Write(s.Msg().GetEvent().GetData().GetPty())
	}
	if _, err := c.Update(ctxT(t), connect.NewRequest(&pb.UpdateRequest{Process: pidSel(pid), Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: 120, Rows: 40}}})); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CloseStdin(ctxT(t), connect.NewRequest(&pb.CloseStdinRequest{Process: pidSel(pid)})); connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("CloseStdin on a PTY: %v, want failed_precondition", err)
	}
	send("stty size; exit 5\n")
	r, err := collect(s)
	if err != nil {
		t.Fatal(err)
	}
	r.pty = out.String() + r.pty
	if r.stdout != "" || r.stderr != "" {
		t.Fatalf("PTY output arrived as stdout/stderr: %q %q", r.stdout, r.stderr)
	}
	for _, want := range []string{"24 80", "is-a-2tty", "40 120"} {
		if !strings.Contains(r.pty, want) {
			t.Fatalf("pty output %q lacks %q", r.pty, want)
		}
	}
	if r.end.GetExitCode() != 5 {
		t.Fatalf("end %v, want exit 5", r.end)
	}
}

func TestUpdateWithoutPTY(t *testing.T) {
	t.Parallel()
	_, cs := clients(t)
	c := cs["proto"]
	pid, _, cancel := startBackground(t, c, &pb.StartRequest{Process: shell("sleep 30")})
	defer cancel()
	defer c.SendSignal(context.Background(), connect.NewRequest(&pb.SendSignalRequest{Process: pidSel(pid), Signal: pb.Signal_SIGNAL_SIGKILL}))
	_, err := c.Update(ctxT(t), connect.NewRequest(&pb.UpdateRequest{Process: pidSel(pid), Pty: &pb.PTY{Size: &pb.PTY_Size{Cols: 1, Rows: 1}}}))
	if connect.CodeOf(err) != connect.CodeFailedPrecondition {
		t.Fatalf("Update of a pipe process: %v, want failed_precondition", err)
	}
}

func TestSignals(t *testing.T) {
	t.Parallel()
	_, cs := clients(t)
	c := cs["json"]
	tests := []struct {
		sig    pb.Signal
		status string
	}{
		{pb.Signal_SIGNAL_SIGTERM, "terminated"},
		{pb.Signal_SIGNAL_SIGKILL, "killed"},
	}
	for _, tc := range tests {
		t.Run(tc.sig.String(), func(t *testing.T) {
			t.Parallel()
			// sh forks sleep: the signal must reach the whole process group.
			pid, s, cancel := startBackground(t, c, &pb.StartRequest{Process: shell("sleep 60; echo not-reached")})
			defer cancel()
			if _, err := c.SendSignal(ctxT(t), connect.NewRequest(&pb.SendSignalRequest{Process: pidSel(pid), Signal: tc.sig})); err != nil {
				t.Fatal(err)
			}
			r, err := collect(s)
			if err != nil {
				t.Fatal(err)
			}
			if r.end.GetExited() || r.end.GetExitCode() != -1 || !strings.Contains(r.end.GetStatus(), tc.status) || r.stdout != "" {
				t.Fatalf("end %v stdout %q, want signal %q", r.end, r.stdout, tc.status)
			}
		})
	}
	t.Run("unsupported signal", func(t *testing.T) {
		pid, _, cancel := startBackground(t, c, &pb.StartRequest{Process: shell("sleep 30")})
		defer cancel()
		defer c.SendSignal(context.Background(), connect.NewRequest(&pb.SendSignalRequest{Process: pidSel(pid), Signal: pb.Signal_SIGNAL_SIGKILL}))
		_, err := c.SendSignal(ctxT(t), connect.NewRequest(&pb.SendSignalRequest{Process: pidSel(pid), Signal: pb.Signal_SIGNAL_UNSPECIFIED}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Fatalf("got %v, want invalid_argument", err)
		}
	})
}

// TestReconnectAfterClientDropped: the process outlives the stream that
// started it; Connect (by pid and by tag) re-attaches and sees later output and the end.
func TestReconnectAfterClientDropped(t *testing.T) {
	t.Parallel()
	_, cs := clients(t)
	c := cs["json"]
	marker := filepath.Join(t.TempDir(), "go")
	tag := "job-" + fmt.Sprint(time.Now().UnixNano())
	script := fmt.Sprintf("echo before; while [ ! -e %s ]; do sleep 0.05; done; echo after; exit 3", marker)
	pid, first, cancel := startBackground(t, c, &pb.StartRequest{Process: shell(script), Tag: &tag})
	// Wait for the early output, so that the re-attached streams below can only see later output.
	for first.Receive() && string(first.Msg().GetEvent().GetData().GetStdout()) != "before\n" {
	}
	cancel() // the client goes away

	list, err := c.List(ctxT(t), connect.NewRequest(&pb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	var found *pb.ProcessInfo
	for _, p := range list.Msg.GetProcesses() {
		if p.GetPid() == pid {
			found = p
		}
	}
	if found == nil || found.GetTag() != tag || found.GetConfig().GetCmd() != "/bin/sh" {
		t.Fatalf("process %d not listed correctly after disconnect: %v", pid, list.Msg.GetProcesses())
	}

	for _, by := range []struct {
		name string
		sel  *pb.ProcessSelector
	}{{"pid", pidSel(pid)}, {"tag", tagSel(tag)}} {
		name, sel := by.name, by.sel
		s, err := c.Connect(ctxT(t), connect.NewRequest(&pb.ConnectRequest{Process: sel}))
		if err != nil {
			t.Fatalf("connect by %s: %v", name, err)
		}
		defer s.Close()
		if !s.Receive() || s.Msg().GetEvent().GetStart().GetPid() != pid {
			t.Fatalf("connect by %s: first event %v, want start{%d}", name, s.Msg(), pid)
		}
		if name == "tag" {
			if err := os.WriteFile(marker, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			r, err := collect(s)
			if err != nil {
				t.Fatal(err)
			}
			if r.stdout != "after\n" || r.end.GetExitCode() != 3 {
				t.Fatalf("reconnected stream got %q end %v", r.stdout, r.end)
			}
		}
	}
	// Once ended, the process is forgotten.
	eventually(t, func() bool {
		s, err := c.Connect(ctxT(t), connect.NewRequest(&pb.ConnectRequest{Process: pidSel(pid)}))
		if err == nil {
			s.Receive() // a stream's error arrives with its first message
			err = s.Err()
			s.Close()
		}
		return connect.CodeOf(err) == connect.CodeNotFound
	})
}

func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	for range 200 {
		if cond() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("condition not met within 10s")
}

// TestBackgroundSurvivesDisconnect: a process keeps running (and writing)
// with nobody listening to its output.
func TestBackgroundSurvivesDisconnect(t *testing.T) {
	t.Parallel()
	_, cs := clients(t)
	out := filepath.Join(t.TempDir(), "out")
	// Lots of output with no reader must not block the process.
	script := fmt.Sprintf("sleep 0.3; head -c 2000000 /dev/zero; echo alive > %s", out)
	_, _, cancel := startBackground(t, cs["proto"], &pb.StartRequest{Process: shell(script)})
	cancel()
	eventually(t, func() bool {
		b, _ := os.ReadFile(out)
		return string(b) == "alive\n"
	})
}

func TestKeepalive(t *testing.T) {
	t.Parallel()
	_, cs := clients(t)
	req := connect.NewRequest(&pb.StartRequest{Process: shell("sleep 2.5")})
	req.Header().Set("Keepalive-Ping-Interval", "1")
	r := runReq(t, cs["json"], req)
	if r.keepalives < 1 {
		t.Fatalf("got %d keepalives in 2.5 s at a 1 s interval", r.keepalives)
	}
	r = run(t, cs["json"], &pb.StartRequest{Process: shell("sleep 1.2")})
	if r.keepalives != 0 {
		t.Fatalf("got %d keepalives without the header", r.keepalives)
	}
}

// TestConnectTimeoutBoundsProcess: Connect-Timeout-Ms on Start kills the process at the deadline.
func TestConnectTimeoutBoundsProcess(t *testing.T) {
	t.Parallel()
	srv, _ := clients(t)
	c := processconnect.NewProcessClient(agenttest.Client, srv.URL, connect.WithProtoJSON())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s, err := c.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: shell("sleep 60")}))
	if err != nil {
		t.Fatal(err)
	}
	if !s.Receive() {
		t.Fatal(s.Err())
	}
	pid := s.Msg().GetEvent().GetStart().GetPid()
	for s.Receive() {
	}
	if connect.CodeOf(s.Err()) != connect.CodeDeadlineExceeded {
		t.Fatalf("stream ended with %v, want deadline_exceeded", s.Err())
	}
	eventually(t, func() bool { return syscall.Kill(int(pid), 0) != nil })
}

func TestUnknownProcess(t *testing.T) {
	t.Parallel()
	_, cs := clients(t)
	c := cs["json"]
	const pid = 1 << 30
	calls := map[string]func() error{
		"SendInput": func() error {
			_, err := c.SendInput(ctxT(t), connect.NewRequest(&pb.SendInputRequest{Process: pidSel(pid), Input: &pb.ProcessInput{Input: &pb.ProcessInput_Stdin{Stdin: []byte("x")}}}))
			return err
		},
		"SendSignal": func() error {
			_, err := c.SendSignal(ctxT(t), connect.NewRequest(&pb.SendSignalRequest{Process: pidSel(pid), Signal: pb.Signal_SIGNAL_SIGKILL}))
			return err
		},
		"CloseStdin": func() error {
			_, err := c.CloseStdin(ctxT(t), connect.NewRequest(&pb.CloseStdinRequest{Process: pidSel(pid)}))
			return err
		},
		"Update": func() error {
			_, err := c.Update(ctxT(t), connect.NewRequest(&pb.UpdateRequest{Process: pidSel(pid)}))
			return err
		},
		"Connect": func() error {
			s, err := c.Connect(ctxT(t), connect.NewRequest(&pb.ConnectRequest{Process: pidSel(pid)}))
			if err == nil {
				s.Receive()
				err = s.Err()
			}
			return err
		},
		"Connect by tag": func() error {
			s, err := c.Connect(ctxT(t), connect.NewRequest(&pb.ConnectRequest{Process: tagSel("no-such-tag")}))
			if err == nil {
				s.Receive()
				err = s.Err()
			}
			return err
		},
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			if err := call(); connect.CodeOf(err) != connect.CodeNotFound {
				t.Fatalf("got %v, want not_found", err)
			}
		})
	}
	t.Run("empty selector", func(t *testing.T) {
		_, err := c.SendSignal(ctxT(t), connect.NewRequest(&pb.SendSignalRequest{Signal: pb.Signal_SIGNAL_SIGKILL}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Fatalf("got %v, want invalid_argument", err)
		}
	})
}

func TestTwoSubscribersSeeTheSameOutput(t *testing.T) {
	t.Parallel()
	_, cs := clients(t)
	c := cs["proto"]
	marker := filepath.Join(t.TempDir(), "go")
	pid, s1, cancel := startBackground(t, c, &pb.StartRequest{Process: shell(fmt.Sprintf("while [ ! -e %s ]; do sleep 0.05; done; seq 1 1000", marker))})
	defer cancel()
	s2, err := c.Connect(ctxT(t), connect.NewRequest(&pb.ConnectRequest{Process: pidSel(pid)}))
	if err != nil {
		t.Fatal(err)
	}
	if !s2.Receive() {
		t.Fatal(s2.Err())
	}
	if err := os.WriteFile(marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r1, err1 := collect(s1)
	r2, err2 := collect(s2)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	if r1.stdout != r2.stdout || !strings.HasSuffix(r1.stdout, "999\n1000\n") {
		t.Fatalf("subscribers disagree or output incomplete: %d vs %d bytes", len(r1.stdout), len(r2.stdout))
	}
}

// TestEndNotHeldByGrandchild: a background grandchild that inherited stdout
// must not hold back the end event of the command that started it.
func TestEndNotHeldByGrandchild(t *testing.T) {
	t.Parallel()
	_, cs := clients(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := cs["json"].Start(ctx, connect.NewRequest(&pb.StartRequest{Process: shell("sleep 60 & echo started")}))
	if err != nil {
		t.Fatal(err)
	}
	r, err := collect(s)
	if err != nil {
		t.Fatalf("no end before the grandchild exits: %v", err)
	}
	if r.stdout != "started\n" || r.end.GetExitCode() != 0 {
		t.Fatalf("got %q end %v", r.stdout, r.end)
	}
	// The grandchild is in the command's process group; clean it up.
	syscall.Kill(-int(r.pid), syscall.SIGKILL)
}
