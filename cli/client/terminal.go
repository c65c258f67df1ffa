package client

import (
	"context"
	"fmt"
	"io"

	"connectrpc.com/connect"

	pb "github.com/agentenv/agentenv/guest/agent/gen/process"
)

// Size is a terminal size in character cells.
type Size struct{ Cols, Rows uint16 }

// TerminalOptions configure Terminal.
type TerminalOptions struct {
	Argv    []string          // nil: the user's login shell (/bin/bash -l)
	Env     map[string]string // TERM is set from the local one by the caller
	Size    Size
	Resizes <-chan Size // new sizes, forwarded to the remote pty
}

// Terminal runs an interactive process on a pseudo-terminal in the sandbox:
// in is sent as keystrokes, the pty output goes to out. It returns the
// process's exit code when it ends.
func (s *Sandbox) Terminal(ctx context.Context, o TerminalOptions, in io.Reader, out io.Writer) (int, error) {
	name, args := "/bin/bash", []string{"-l"}
	if len(o.Argv) > 0 {
		name, args = loginExec(o.Argv)
	}
	size := func(sz Size) *pb.PTY {
		if sz.Cols == 0 || sz.Rows == 0 {
			sz = Size{80, 24}
		}
		return &pb.PTY{Size: &pb.PTY_Size{Cols: uint32(sz.Cols), Rows: uint32(sz.Rows)}}
	}
	stdin := true
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := s.proc().Start(ctx, connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: name, Args: args, Envs: o.Env},
		Pty:     size(o.Size),
		Stdin:   &stdin,
	}))
	if err != nil {
		return -1, s.agentError("start a terminal", err)
	}
	defer stream.Close()
	var pid uint32
	// An interactive shell ignores SIGTERM: kill it if aenv is stopped.
	defer func() { s.stopIfCancelled(ctx, pid, pb.Signal_SIGNAL_SIGKILL) }()
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		switch {
		case ev.GetStart() != nil:
			pid = ev.GetStart().GetPid()
			go s.feed(ctx, pid, in, true)
			if o.Resizes != nil {
				go func(pid uint32) {
					sel := &pb.ProcessSelector{Selector: &pb.ProcessSelector_Pid{Pid: pid}}
					for {
						select {
						case <-ctx.Done():
							return
						case sz := <-o.Resizes:
							_, _ = s.proc().Update(ctx, connect.NewRequest(&pb.UpdateRequest{Process: sel, Pty: size(sz)}))
						}
					}
				}(pid)
			}
		case ev.GetData() != nil:
			d := ev.GetData()
			if _, err := out.Write(d.GetPty()); err != nil {
				return -1, fmt.Errorf("write terminal output: %w", err)
			}
			_, _ = out.Write(d.GetStdout())
			_, _ = out.Write(d.GetStderr())
		case ev.GetEnd() != nil:
			pid = 0
			return int(ev.GetEnd().GetExitCode()), nil
		}
	}
	if err := stream.Err(); err != nil {
		return -1, s.agentError("terminal", err)
	}
	return -1, fmt.Errorf("terminal in sandbox %s: the stream ended without an exit status", s.ID)
}
