package blob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// DefaultServerWait is how long a read of a http+unix blob waits, by
// default, for the server behind the socket to come back. The node's layer
// socket is served by aenvd: a crash, kill -9 or upgrade leaves it refusing
// connections until the next aenvd listens again, which takes seconds to a
// minute or two (it opens its repository first). Giving up sooner turns a
// control-plane restart into I/O errors in the guests of lazily restored
// sandboxes.
const DefaultServerWait = 5 * time.Minute

// maxBroken bounds the answers that break off in a row while the server
// still accepts connections: the one cut by a server's death is retried
// (the next connection then fails and the wait takes over), but a server
// that keeps cutting its answers has a bug a wait must not hide.
const maxBroken = 3

// unixBlob is a blob served over HTTP on a local Unix socket whose reads
// wait for the server while it is away (and only then: any other failure,
// such as a 422 for bytes no source verifies, fails the read at once).
type unixBlob struct {
	*HTTP
	wait   time.Duration
	cancel context.CancelFunc
	out    *outage
}

// ReadAt reads with one range request, waiting for the server while it is
// away. A plain io.EOF is ReadAt's own end-of-blob signal, not a failure.
func (u *unixBlob) ReadAt(p []byte, off int64) (int, error) {
	var n int
	var eof error
	err := u.waitServer(func() error {
		var err error
		n, err = u.HTTP.ReadAt(p, off)
		if err == io.EOF { //nolint:errorlint // the sentinel itself, unwrapped: a successful read to the end
			eof, err = err, nil
		}
		return err
	})
	if err != nil {
		return n, err
	}
	return n, eof
}

// Close ends the waits of reads in flight (a device being removed, the
// daemon stopping): they fail at once instead of holding their caller.
func (u *unixBlob) Close() error {
	u.cancel()
	return u.HTTP.Close()
}

// waitServer runs op until it succeeds, fails for a reason other than the
// server being away, the server stayed away for u.wait, or the blob's
// context ends.
func (u *unixBlob) waitServer(op func() error) error {
	var since time.Time // when this call first found the server away
	broken, delay := 0, 50*time.Millisecond
	for {
		err := op()
		if err == nil {
			u.out.done()
			return nil
		}
		switch {
		case serverDown(err):
			broken = 0
		case answerBroken(err):
			if broken++; broken > maxBroken {
				return fmt.Errorf("%d answers in a row broke off while the server accepts connections: %w", broken, err)
			}
		default:
			return err
		}
		if since.IsZero() {
			since = time.Now()
			u.out.begin(u.wait, err)
		}
		waited := time.Since(since)
		if waited >= u.wait {
			u.out.gaveUp(waited, err)
			return fmt.Errorf("server away for %s (the bound): %w", waited.Round(time.Second), err)
		}
		t := time.NewTimer(min(delay, u.wait-waited))
		select {
		case <-u.HTTP.ctx.Done():
			t.Stop()
			return fmt.Errorf("waiting for the server: %w (%w)", u.HTTP.ctx.Err(), err)
		case <-t.C:
		}
		delay = min(2*delay, time.Second)
	}
}

// serverAway reports the errors of a server that is not there: get hands
// them back at once for waitServer to wait on.
func serverAway(err error) bool { return serverDown(err) || answerBroken(err) }

// serverDown: nothing listens on the socket (its file is gone, or left by
// a process that died), so connecting fails.
func serverDown(err error) bool {
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "dial" {
		return false
	}
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT)
}

// answerBroken: a connection to the server ended before its answer did (the
// server died with requests in flight).
func answerBroken(err error) bool {
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// outage is what the reads of one socket know of its server being away:
// the first read to find it away logs that reads wait, the first to get
// an answer afterwards logs that they resume.
type outage struct {
	socket string
	log    *slog.Logger
	active atomic.Bool // the server is away (read without the lock by every answered read)
	mu     sync.Mutex
	since  time.Time // when the outage began
	failed bool      // a read gave up during this outage (logged once)
}

var outages sync.Map // socket path → *outage

func outageOf(socket string, log *slog.Logger) *outage {
	o, _ := outages.LoadOrStore(socket, &outage{socket: socket, log: log})
	return o.(*outage)
}

func (o *outage) begin(wait time.Duration, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.active.Load() {
		return
	}
	o.active.Store(true)
	o.since, o.failed = time.Now(), false
	o.log.Warn("layer socket unreachable: lazy reads wait for the server (aenvd) to come back",
		"socket", o.socket, "bound", wait, "err", err)
}

func (o *outage) done() {
	if !o.active.Load() {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.active.Load() {
		return
	}
	o.active.Store(false)
	o.log.Info("layer socket answers again: lazy reads resume", "socket", o.socket, "after", time.Since(o.since).Round(time.Millisecond))
}

func (o *outage) gaveUp(waited time.Duration, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.failed {
		return
	}
	o.failed = true
	o.log.Error("layer socket still unreachable: a lazy read fails (an I/O error in the guest)",
		"socket", o.socket, "waited", waited.Round(time.Second), "err", err)
}
