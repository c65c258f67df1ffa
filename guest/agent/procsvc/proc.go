package procsvc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"

	pb "github.com/agentenv/agentenv/guest/agent/gen/process"
)

// readChunk is the largest data event the agent sends.
const readChunk = 32 << 10

// drainGrace is how long, after the process exited, the agent keeps reading
// output that is still in flight. Output written before exit is already in
// the pipe and is read well within it; the bound only matters when a
// grandchild inherited stdout and keeps it open (`sleep 100 &`), which must
// not hold the end event back.
const drainGrace = 2 * time.Second

// proc is one started process, its output fan-out and its end.
type proc struct {
	pid uint32
	tag *string
	cfg *pb.ProcessConfig
	cmd *exec.Cmd

	tty *os.File // PTY master, nil without a PTY

	stdinMu sync.Mutex
	stdin   *os.File // pipe to the child's stdin, nil when closed or absent

	outputs []output

	mu    sync.Mutex
	subs  map[*subscriber]struct{}
	ended bool
	end   *pb.ProcessEvent_EndEvent
	done  chan struct{} // closed once end is set
}

type output struct {
	f    *os.File
	kind func([]byte) *pb.ProcessEvent_DataEvent
}

// subscriber receives the events of one stream (Start or Connect).
type subscriber struct {
	ch   chan *pb.ProcessEvent
	gone chan struct{} // closed when the stream stopped listening
}

func stdoutEvent(b []byte) *pb.ProcessEvent_DataEvent {
	return &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stdout{Stdout: b}}
}

func stderrEvent(b []byte) *pb.ProcessEvent_DataEvent {
	return &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Stderr{Stderr: b}}
}

func ptyEvent(b []byte) *pb.ProcessEvent_DataEvent {
	return &pb.ProcessEvent_DataEvent{Output: &pb.ProcessEvent_DataEvent_Pty{Pty: b}}
}

// spawnSpec is everything needed to start a process.
type spawnSpec struct {
	path  string
	args  []string
	env   []string
	dir   string
	cred  *syscall.Credential
	pty   *pb.PTY
	stdin bool
	chown func(name string) // gives the PTY slave to the target user
}

// spawn starts the process. Output is not read until run is called, so that
// the first subscriber can register before any data event exists.
func spawn(spec spawnSpec) (*proc, error) {
	cmd := exec.Command(spec.path, spec.args...)
	cmd.Env = spec.env
	cmd.Dir = spec.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: spec.cred}
	p := &proc{cmd: cmd, subs: map[*subscriber]struct{}{}, done: make(chan struct{})}
	var err error
	if spec.pty != nil {
		err = p.startPTY(spec)
	} else {
		err = p.startPipes(spec)
	}
	if err != nil {
		return nil, err
	}
	p.pid = uint32(cmd.Process.Pid)
	return p, nil
}

func (p *proc) startPipes(spec spawnSpec) error {
	// A process group of its own, so that signals reach the whole command
	// (bash -c "x" forks x) and not the agent.
	p.cmd.SysProcAttr.Setpgid = true
	var closeAfter []*os.File
	defer func() {
		for _, f := range closeAfter {
			f.Close()
		}
	}()
	for _, kind := range []func([]byte) *pb.ProcessEvent_DataEvent{stdoutEvent, stderrEvent} {
		r, w, err := os.Pipe()
		if err != nil {
			p.closeOutputs()
			return fmt.Errorf("create output pipe: %w", err)
		}
		closeAfter = append(closeAfter, w)
		p.outputs = append(p.outputs, output{f: r, kind: kind})
	}
	p.cmd.Stdout = closeAfter[0]
	p.cmd.Stderr = closeAfter[1]
	if spec.stdin {
		r, w, err := os.Pipe()
		if err != nil {
			p.closeOutputs()
			return fmt.Errorf("create stdin pipe: %w", err)
		}
		closeAfter = append(closeAfter, r)
		p.cmd.Stdin = r
		p.stdin = w
	}
	if err := p.cmd.Start(); err != nil {
		p.closeOutputs()
		if p.stdin != nil {
			p.stdin.Close()
		}
		return fmt.Errorf("start %s: %w", spec.path, err)
	}
	return nil
}

func (p *proc) startPTY(spec spawnSpec) error {
	master, tty, err := pty.Open()
	if err != nil {
		return fmt.Errorf("open pty: %w", err)
	}
	defer tty.Close()
	if sz := spec.pty.GetSize(); sz != nil && sz.Cols > 0 && sz.Rows > 0 {
		if err := pty.Setsize(master, &pty.Winsize{Cols: uint16(sz.Cols), Rows: uint16(sz.Rows)}); err != nil {
			master.Close()
			return fmt.Errorf("size pty: %w", err)
		}
	}
	if spec.chown != nil {
		spec.chown(tty.Name())
	}
	p.cmd.Stdin, p.cmd.Stdout, p.cmd.Stderr = tty, tty, tty
	p.cmd.SysProcAttr.Setsid = true
	p.cmd.SysProcAttr.Setctty = true
	p.cmd.SysProcAttr.Ctty = 0
	if err := p.cmd.Start(); err != nil {
		master.Close()
		return fmt.Errorf("start %s on pty: %w", spec.path, err)
	}
	p.tty = master
	p.outputs = []output{{f: master, kind: ptyEvent}}
	return nil
}

func (p *proc) closeOutputs() {
	for _, o := range p.outputs {
		o.f.Close()
	}
}

// run reads output until the process ended, then publishes the end event.
// onEnd runs after the end is published.
func (p *proc) run(onEnd func()) {
	var wg sync.WaitGroup
	for _, o := range p.outputs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.pump(o)
		}()
	}
	readersDone := make(chan struct{})
	go func() { wg.Wait(); close(readersDone) }()

	waitErr := p.cmd.Wait()
	select {
	case <-readersDone:
	case <-time.After(drainGrace):
	}
	p.finish(waitErr)
	p.closeOutputs()
	p.closeStdin()
	onEnd()
}

func (p *proc) pump(o output) {
	buf := make([]byte, readChunk)
	for {
		n, err := o.f.Read(buf)
		if n > 0 {
			data := make([]byte, n)
			copy(data, buf[:n])
			p.broadcast(&pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: o.kind(data)}})
		}
		if err != nil {
			// EOF for pipes; EIO for a PTY whose last slave closed.
			return
		}
	}
}

// broadcast hands ev to every current subscriber. It blocks on a slow
// subscriber, which pushes back on the process through the pipe, but never
// on one that left. With no subscriber the output is dropped, so a
// background process never blocks for want of a reader.
func (p *proc) broadcast(ev *pb.ProcessEvent) {
	p.mu.Lock()
	if p.ended {
		p.mu.Unlock()
		return
	}
	subs := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	for _, s := range subs {
		select {
		case s.ch <- ev:
		case <-s.gone:
		}
	}
}

func (p *proc) finish(waitErr error) {
	end := &pb.ProcessEvent_EndEvent{ExitCode: -1}
	if st := p.cmd.ProcessState; st != nil {
		end.ExitCode = int32(st.ExitCode())
		end.Exited = st.Exited()
		end.Status = st.String()
		if !st.Success() {
			msg := st.String()
			end.Error = &msg
		}
	}
	var exitErr *exec.ExitError
	if waitErr != nil && !errors.As(waitErr, &exitErr) {
		msg := waitErr.Error()
		end.Error = &msg
	}
	p.mu.Lock()
	p.ended = true
	p.end = end
	p.mu.Unlock()
	close(p.done)
}

func (p *proc) subscribe() *subscriber {
	s := &subscriber{ch: make(chan *pb.ProcessEvent, 64), gone: make(chan struct{})}
	p.mu.Lock()
	p.subs[s] = struct{}{}
	p.mu.Unlock()
	return s
}

func (p *proc) unsubscribe(s *subscriber) {
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
	close(s.gone)
}

// endEvent returns the end event; valid once done is closed.
func (p *proc) endEvent() *pb.ProcessEvent_EndEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.end
}

func (p *proc) writeInput(in *pb.ProcessInput) error {
	switch v := in.GetInput().(type) {
	case *pb.ProcessInput_Pty:
		if p.tty == nil {
			return errNoPTY
		}
		_, err := p.tty.Write(v.Pty)
		return err
	case *pb.ProcessInput_Stdin:
		if p.tty != nil {
			// A PTY has one input; accept stdin bytes there too.
			_, err := p.tty.Write(v.Stdin)
			return err
		}
		p.stdinMu.Lock()
		defer p.stdinMu.Unlock()
		if p.stdin == nil {
			return errNoStdin
		}
		_, err := p.stdin.Write(v.Stdin)
		return err
	default:
		return errEmptyInput
	}
}

func (p *proc) closeStdin() error {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin == nil {
		return errNoStdin
	}
	err := p.stdin.Close()
	p.stdin = nil
	return err
}

// signal sends sig to the process group when the process leads one, else to
// the process. Once the process was reaped its pid may belong to another
// process, so an ended process is never signalled.
func (p *proc) signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return errEnded
	default:
	}
	if err := syscall.Kill(-int(p.pid), sig); err == nil {
		return nil
	}
	return syscall.Kill(int(p.pid), sig)
}

func (p *proc) resize(sz *pb.PTY_Size) error {
	if p.tty == nil {
		return errNoPTY
	}
	return pty.Setsize(p.tty, &pty.Winsize{Cols: uint16(sz.GetCols()), Rows: uint16(sz.GetRows())})
}

var (
	errNoPTY      = errors.New("process has no pty")
	errNoStdin    = errors.New("process stdin is not open")
	errEmptyInput = errors.New("input is empty")
	errEnded      = errors.New("process has ended")
)
