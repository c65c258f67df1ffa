package nbd

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
)

// Request buffers come from power-of-two size-class pools (4 KiB to the
// maximum payload), so steady-state I/O allocates nothing whatever the
// request size.
const (
	minClassShift = 12
	numClasses    = 14 // 4 KiB << 13 = 32 MiB
)

var bufPools [numClasses]sync.Pool

func sizeClass(n uint32) int {
	c := 0
	for uint64(1)<<(minClassShift+c) < uint64(n) {
		c++
	}
	return c
}

func getBuf(n uint32) (*[]byte, []byte) {
	c := sizeClass(n)
	if c >= numClasses {
		return nil, make([]byte, n)
	}
	if p, ok := bufPools[c].Get().(*[]byte); ok {
		return p, (*p)[:n]
	}
	b := make([]byte, 1<<(minClassShift+c))
	return &b, b[:n]
}

func putBuf(p *[]byte) {
	if p != nil {
		bufPools[sizeClass(uint32(cap(*p)))].Put(p)
	}
}

// transmitter serves requests for one connection in the transmission phase.
type transmitter struct {
	c   *session
	e   *Export
	max uint32
	sem chan struct{}
	wg  sync.WaitGroup

	wmu     sync.Mutex // guards the reply queue below
	queue   []outReply
	spare   []outReply
	writing bool // a goroutine is writing the queue
	werr    error
}

// transmit reads requests until DISC, a protocol violation or a socket error.
// Each request is served on its own goroutine (bounded by MaxInFlight) and
// replies are written in completion order.
func (c *session) transmit(e *Export) error {
	c.mu.Lock()
	c.exp = e
	c.mu.Unlock()
	t := &transmitter{c: c, e: e, max: c.srv.opts.MaxPayload, sem: make(chan struct{}, c.srv.opts.MaxInFlight)}
	err := t.loop()
	t.wg.Wait() // in-flight requests still get their replies before we close
	return err
}

func (t *transmitter) loop() error {
	var hb [requestLen]byte
	for {
		if _, err := io.ReadFull(t.c.br, hb[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("nbd %q: read request: %w", t.e.Name, err)
		}
		req, err := parseRequest(hb[:])
		if err != nil {
			return fmt.Errorf("nbd %q: %w", t.e.Name, err)
		}
		if req.typ == cmdDisc {
			return nil
		}
		if err := t.dispatch(req); err != nil {
			return err
		}
		if err := t.writeErr(); err != nil {
			return err
		}
	}
}

// dispatch validates one request, reads its payload, and starts serving it.
// It returns an error only when the connection cannot continue.
func (t *transmitter) dispatch(req request) error {
	size := uint64(t.e.Backend.Size())
	inRange := req.offset <= size && uint64(req.length) <= size-req.offset
	switch req.typ {
	case cmdWrite:
		return t.dispatchWrite(req, inRange)
	case cmdRead:
		if req.length > t.max || !inRange {
			return t.reply(req.handle, errInval, nil)
		}
		t.start(func() { t.serveRead(req) })
	case cmdFlush:
		t.start(func() { t.reply(req.handle, errno(t.e.Backend.Flush()), nil) })
	case cmdTrim, cmdWriteZeroes:
		switch {
		case t.e.ReadOnly:
			return t.reply(req.handle, errPerm, nil)
		case !inRange:
			return t.reply(req.handle, errNoSpc, nil)
		}
		t.start(func() { t.serveZero(req) })
	case cmdCache:
		// Advisory prefetch; nothing to do for a page-cache-backed store.
		return t.reply(req.handle, 0, nil)
	default:
		// Unknown commands carry no payload we could know about.
		return t.reply(req.handle, errInval, nil)
	}
	return nil
}

func (t *transmitter) dispatchWrite(req request, inRange bool) error {
	if req.length > t.max {
		// We cannot tell the client no without reading the payload, and we
		// will not buffer it: the protocol lets us drop the connection.
		return fmt.Errorf("nbd %q: write of %d bytes exceeds maximum %d", t.e.Name, req.length, t.max)
	}
	pb, buf := getBuf(req.length)
	if _, err := io.ReadFull(t.c.br, buf); err != nil {
		putBuf(pb)
		return fmt.Errorf("nbd %q: read write payload: %w", t.e.Name, err)
	}
	switch {
	case t.e.ReadOnly:
		putBuf(pb)
		return t.reply(req.handle, errPerm, nil)
	case !inRange:
		putBuf(pb)
		return t.reply(req.handle, errNoSpc, nil)
	}
	t.start(func() {
		defer putBuf(pb)
		_, err := t.e.Backend.WriteAt(buf, int64(req.offset))
		if err == nil && req.flags&cmdFlagFUA != 0 {
			err = t.e.Backend.Flush()
		}
		t.reply(req.handle, errno(err), nil)
	})
	return nil
}

// start runs fn on a new goroutine once a slot is free. Waiting here is the
// backpressure: the reader stops pulling requests off the socket.
func (t *transmitter) start(fn func()) {
	t.sem <- struct{}{}
	t.wg.Add(1)
	go func() {
		defer func() { <-t.sem; t.wg.Done() }()
		fn()
	}()
}

func (t *transmitter) serveRead(req request) {
	pb, buf := getBuf(req.length)
	n, err := t.e.Backend.ReadAt(buf, int64(req.offset))
	if n == len(buf) {
		err = nil // io.ReaderAt may report EOF with a full read at the very end
	}
	if err != nil {
		putBuf(pb)
		t.reply(req.handle, errno(err), nil)
		return
	}
	t.send(req.handle, 0, buf, pb) // send returns the buffer once written
}

func (t *transmitter) serveZero(req request) {
	off, n := int64(req.offset), int64(req.length)
	var err error
	switch {
	case req.typ == cmdTrim:
		err = t.e.Backend.Trim(off, n)
	default:
		if z, ok := t.e.Backend.(Zeroer); ok {
			err = z.WriteZeroes(off, n)
		} else {
			err = writeZeroes(t.e.Backend, off, n)
		}
	}
	if err == nil && req.flags&cmdFlagFUA != 0 {
		err = t.e.Backend.Flush()
	}
	t.reply(req.handle, errno(err), nil)
}

// reply sends a simple reply without read data.
func (t *transmitter) reply(handle uint64, code uint32, data []byte) error {
	return t.send(handle, code, data, nil)
}

// outReply is one reply waiting to be written; pb (if set) is returned to
// its pool once data is on the wire.
type outReply struct {
	hdr  [simpleReplyLen]byte
	data []byte
	pb   *[]byte
}

// send queues a reply and writes the queue unless another goroutine is
// already writing it. Whoever finds the socket idle becomes the writer and
// flushes every reply queued meanwhile with one writev, so under load many
// replies share a system call, while a lone request still writes at once
// without a hand-off to another goroutine.
func (t *transmitter) send(handle uint64, code uint32, data []byte, pb *[]byte) error {
	r := outReply{data: data, pb: pb}
	putSimpleReply(r.hdr[:], code, handle)
	t.wmu.Lock()
	if t.werr != nil {
		t.wmu.Unlock()
		putBuf(pb)
		return t.werr
	}
	t.queue = append(t.queue, r)
	if t.writing {
		t.wmu.Unlock()
		return nil
	}
	t.writing = true
	for len(t.queue) > 0 && t.werr == nil {
		batch := t.queue
		t.queue = t.spare[:0]
		t.wmu.Unlock()
		err := t.writeBatch(batch)
		t.wmu.Lock()
		t.spare = batch[:0]
		if err != nil {
			t.werr = fmt.Errorf("nbd %q: send reply: %w", t.e.Name, err)
			t.c.close()
		}
	}
	for _, r := range t.queue { // only left when the socket failed
		putBuf(r.pb)
	}
	t.queue = t.queue[:0]
	t.writing = false
	err := t.werr
	t.wmu.Unlock()
	return err
}

func (t *transmitter) writeBatch(batch []outReply) error {
	bufs := make(net.Buffers, 0, 2*len(batch))
	for i := range batch {
		bufs = append(bufs, batch[i].hdr[:])
		if len(batch[i].data) > 0 {
			bufs = append(bufs, batch[i].data)
		}
	}
	_, err := bufs.WriteTo(t.c.conn)
	for i := range batch {
		putBuf(batch[i].pb)
		batch[i] = outReply{}
	}
	return err
}

func (t *transmitter) writeErr() error {
	t.wmu.Lock()
	defer t.wmu.Unlock()
	return t.werr
}

// errno maps a backend error to the protocol's error numbers.
func errno(err error) uint32 {
	var en syscall.Errno
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrReadOnly):
		return errPerm
	case errors.As(err, &en) && en == syscall.ENOSPC:
		return errNoSpc
	case errors.As(err, &en) && en == syscall.ENOMEM:
		return errNoMem
	default:
		return errIO
	}
}
