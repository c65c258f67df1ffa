// Package qmp is a small client for the QEMU Machine Protocol: JSON commands
// over a Unix socket, with file descriptors passed alongside (SCM_RIGHTS) so
// QEMU never has to open host paths or run shell commands for us.
package qmp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// Event is an asynchronous QMP event (STOP, RESUME, SHUTDOWN, ...).
type Event struct {
	Name string          `json:"event"`
	Data json.RawMessage `json:"data"`
}

// Error is a command that QEMU answered with an error.
type Error struct {
	Command string
	Class   string `json:"class"`
	Desc    string `json:"desc"`
}

func (e *Error) Error() string { return fmt.Sprintf("qmp %s: %s: %s", e.Command, e.Class, e.Desc) }

// ErrClosed is returned for commands on a closed or broken connection.
var ErrClosed = errors.New("qmp: connection closed")

// Conn is one QMP session. Commands may be issued concurrently.
type Conn struct {
	conn   *net.UnixConn
	writeM sync.Mutex
	mu     sync.Mutex
	nextID uint64
	wait   map[string]chan response
	events chan Event
	done   chan struct{}
	err    error
}

type response struct {
	Return json.RawMessage `json:"return"`
	Error  *Error          `json:"error"`
	ID     string          `json:"id"`
	Event  string          `json:"event"`
	Data   json.RawMessage `json:"data"`
}

// Dial connects to a QMP socket, retrying until ctx ends (QEMU creates the
// socket a little after it starts), and negotiates capabilities.
func Dial(ctx context.Context, path string) (*Conn, error) {
	var c *net.UnixConn
	for {
		uc, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
		if err == nil {
			c = uc
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("qmp: connect %s: %w (last error: %v)", path, ctx.Err(), err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	q, err := handshake(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("qmp: %s: %w", path, err)
	}
	return q, nil
}

// MaxMessage bounds one message from QEMU (a line of JSON). Its largest
// answers (query-qmp-schema) are a few hundred KiB; a peer that sends more
// is not a QEMU we drive, and its connection is closed rather than read
// into memory without end.
const MaxMessage = 8 << 20

// readMessage reads one line of at most MaxMessage bytes.
func readMessage(r *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		frag, err := r.ReadSlice('\n')
		if len(line)+len(frag) > MaxMessage {
			return nil, fmt.Errorf("message longer than %d bytes", MaxMessage)
		}
		line = append(line, frag...)
		if err != bufio.ErrBufferFull {
			return line, err
		}
	}
}

// handshake reads the greeting on c and negotiates capabilities; c is
// closed on failure.
func handshake(ctx context.Context, c *net.UnixConn) (*Conn, error) {
	q := &Conn{conn: c, wait: map[string]chan response{}, events: make(chan Event, 64), done: make(chan struct{})}
	r := bufio.NewReaderSize(c, 64<<10)
	// The greeting comes first and carries no id.
	stop := context.AfterFunc(ctx, func() { _ = c.SetReadDeadline(time.Now()) })
	_, err := readMessage(r)
	stop()
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("read greeting: %w", err)
	}
	_ = c.SetReadDeadline(time.Time{})
	go q.readLoop(r)
	if err := q.Execute(ctx, "qmp_capabilities", nil, nil); err != nil {
		q.Close()
		return nil, err
	}
	return q, nil
}

// Events delivers asynchronous events; it is closed when the connection ends.
// Events are dropped when nobody reads and the buffer is full.
func (q *Conn) Events() <-chan Event { return q.events }

// Done is closed when the connection ends (QEMU exited or Close).
func (q *Conn) Done() <-chan struct{} { return q.done }

func (q *Conn) readLoop(r *bufio.Reader) {
	defer close(q.events)
	for {
		line, err := readMessage(r)
		if err != nil {
			q.fail(fmt.Errorf("%w: %v", ErrClosed, err))
			q.conn.Close()
			return
		}
		var resp response
		if json.Unmarshal(line, &resp) != nil {
			continue // not ours to crash on; QEMU only sends JSON objects
		}
		if resp.Event != "" {
			select {
			case q.events <- Event{Name: resp.Event, Data: resp.Data}:
			default:
			}
			continue
		}
		q.mu.Lock()
		ch := q.wait[resp.ID]
		delete(q.wait, resp.ID)
		q.mu.Unlock()
		if ch != nil {
			ch <- resp
		}
	}
}

func (q *Conn) fail(err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err != nil {
		return
	}
	q.err = err
	close(q.done)
	for id, ch := range q.wait {
		close(ch)
		delete(q.wait, id)
	}
}

// Close ends the session.
func (q *Conn) Close() error {
	err := q.conn.Close()
	q.fail(ErrClosed)
	return err
}

// Execute runs a command and decodes its "return" value into out (if non-nil).
func (q *Conn) Execute(ctx context.Context, cmd string, args any, out any) error {
	return q.ExecuteWithFile(ctx, cmd, args, nil, out)
}

// ExecuteWithFile runs a command and passes f along with it (for getfd and add-fd).
func (q *Conn) ExecuteWithFile(ctx context.Context, cmd string, args any, f *os.File, out any) error {
	q.mu.Lock()
	if q.err != nil {
		q.mu.Unlock()
		return fmt.Errorf("qmp %s: %w", cmd, q.err)
	}
	q.nextID++
	id := fmt.Sprintf("aenv-%d", q.nextID)
	ch := make(chan response, 1)
	q.wait[id] = ch
	q.mu.Unlock()

	msg := map[string]any{"execute": cmd, "id": id}
	if args != nil {
		msg["arguments"] = args
	}
	b, err := json.Marshal(msg)
	if err != nil {
		return fmt.Errorf("qmp %s: encode: %w", cmd, err)
	}
	if err := q.write(append(b, '\n'), f); err != nil {
		q.forget(id)
		return fmt.Errorf("qmp %s: %w", cmd, err)
	}
	select {
	case resp, ok := <-ch:
		if !ok {
			return fmt.Errorf("qmp %s: %w", cmd, ErrClosed)
		}
		if resp.Error != nil {
			resp.Error.Command = cmd
			return resp.Error
		}
		if out != nil && len(resp.Return) > 0 {
			if err := json.Unmarshal(resp.Return, out); err != nil {
				return fmt.Errorf("qmp %s: decode reply: %w", cmd, err)
			}
		}
		return nil
	case <-ctx.Done():
		q.forget(id)
		return fmt.Errorf("qmp %s: %w", cmd, ctx.Err())
	}
}

func (q *Conn) forget(id string) {
	q.mu.Lock()
	delete(q.wait, id)
	q.mu.Unlock()
}

func (q *Conn) write(b []byte, f *os.File) error {
	q.writeM.Lock()
	defer q.writeM.Unlock()
	if f == nil {
		_, err := q.conn.Write(b)
		return err
	}
	// The descriptor travels with the first byte of the command.
	oob := syscall.UnixRights(int(f.Fd()))
	n, oobn, err := q.conn.WriteMsgUnix(b, oob, nil)
	if err != nil {
		return err
	}
	if oobn != len(oob) {
		return errors.New("descriptor not sent")
	}
	if n < len(b) {
		_, err = q.conn.Write(b[n:])
	}
	return err
}
