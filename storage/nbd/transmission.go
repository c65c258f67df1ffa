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
	// sem and mem bound what one connection holds: requests being served or
	// whose reply is not yet on the wire, and the payload bytes they carry.
	// Both are released only when a reply is written, so a client that stops
	// reading replies stalls its own connection instead of growing memory.
	sem chan struct{}
	mem *budget
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
	o := &c.srv.opts
	t := &transmitter{c: c, e: e, max: o.MaxPayload, sem: make(chan struct{}, o.MaxInFlight),
		mem: newBudget(max(o.MaxInFlightBytes, int64(o.MaxPayload)))}
	if h := c.srv.onTransmit; h != nil {
		h(t)
	}
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
		tk := t.acquire(int64(req.length))
		t.run(func() { t.serveRead(req, tk) })
	case cmdFlush:
		tk := t.acquire(0)
		t.run(func() { t.finish(req.handle, errno(t.e.Backend.Flush()), nil, nil, tk) })
	case cmdTrim, cmdWriteZeroes:
		switch {
		case t.e.ReadOnly:
			return t.reply(req.handle, errPerm, nil)
		case !inRange:
			return t.reply(req.handle, errNoSpc, nil)
		}
		tk := t.acquire(0)
		t.run(func() { t.serveZero(req, tk) })
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
	tk := t.acquire(int64(req.length)) // before the payload is buffered
	pb, buf := getBuf(req.length)
	if _, err := io.ReadFull(t.c.br, buf); err != nil {
		putBuf(pb)
		t.release(tk)
		return fmt.Errorf("nbd %q: read write payload: %w", t.e.Name, err)
	}
	switch {
	case t.e.ReadOnly:
		putBuf(pb)
		return t.finish(req.handle, errPerm, nil, nil, tk)
	case !inRange:
		putBuf(pb)
		return t.finish(req.handle, errNoSpc, nil, nil, tk)
	}
	t.run(func() {
		_, err := t.e.Backend.WriteAt(buf, int64(req.offset))
		putBuf(pb)
		if err == nil && req.flags&cmdFlagFUA != 0 {
			err = t.e.Backend.Flush()
		}
		t.finish(req.handle, errno(err), nil, nil, tk)
	})
	return nil
}

// ticket is what a served request holds until its reply is written.
type ticket struct {
	held  bool
	bytes int64
}

// acquire waits for a request slot and payload budget. Waiting here is the
// backpressure: the reader stops pulling requests off the socket.
func (t *transmitter) acquire(bytes int64) ticket {
	t.sem <- struct{}{}
	t.mem.acquire(bytes)
	return ticket{held: true, bytes: bytes}
}

func (t *transmitter) release(tk ticket) {
	if tk.held {
		t.mem.release(tk.bytes)
		<-t.sem
	}
}

// run serves fn on a new goroutine.
func (t *transmitter) run(fn func()) {
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		fn()
	}()
}

func (t *transmitter) serveRead(req request, tk ticket) {
	pb, buf := getBuf(req.length)
	n, err := t.e.Backend.ReadAt(buf, int64(req.offset))
	if n == len(buf) {
		err = nil // io.ReaderAt may report EOF with a full read at the very end
	}
	if err != nil {
		putBuf(pb)
		t.finish(req.handle, errno(err), nil, nil, tk)
		return
	}
	t.finish(req.handle, 0, buf, pb, tk) // the buffer is returned once written
}

func (t *transmitter) serveZero(req request, tk ticket) {
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
	t.finish(req.handle, errno(err), nil, nil, tk)
}

// reply sends a reply for a request that holds no ticket.
func (t *transmitter) reply(handle uint64, code uint32, data []byte) error {
	return t.send(outReply{data: data}, handle, code)
}

// finish sends the reply of a served request; its buffer and ticket are
// released once the reply is on the wire (or the connection failed).
func (t *transmitter) finish(handle uint64, code uint32, data []byte, pb *[]byte, tk ticket) error {
	return t.send(outReply{data: data, pb: pb, tk: tk}, handle, code)
}

// outReply is one reply waiting to be written; pb (if set) is returned to
// its pool once data is on the wire.
type outReply struct {
	hdr  [simpleReplyLen]byte
	data []byte
	pb   *[]byte
	tk   ticket
}

// send queues a reply and writes the queue unless another goroutine is
// already writing it. Whoever finds the socket idle becomes the writer and
// flushes every reply queued meanwhile with one writev, so under load many
// replies share a system call, while a lone request still writes at once
// without a hand-off to another goroutine.
func (t *transmitter) send(r outReply, handle uint64, code uint32) error {
	putSimpleReply(r.hdr[:], code, handle)
	t.wmu.Lock()
	if t.werr != nil {
		t.wmu.Unlock()
		t.done(&r)
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
	for i := range t.queue { // only left when the socket failed
		t.done(&t.queue[i])
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
		t.done(&batch[i])
	}
	return err
}

// done releases what a reply held once it is written or dropped.
func (t *transmitter) done(r *outReply) {
	putBuf(r.pb)
	t.release(r.tk)
	*r = outReply{}
}

// budget is a counting semaphore over bytes.
type budget struct {
	mu         sync.Mutex
	cond       sync.Cond
	free, peak int64
	total      int64
}

func newBudget(total int64) *budget {
	b := &budget{free: total, total: total}
	b.cond.L = &b.mu
	return b
}

func (b *budget) acquire(n int64) {
	n = min(n, b.total) // one maximal request always fits
	b.mu.Lock()
	for b.free < n {
		b.cond.Wait()
	}
	b.free -= n
	b.peak = max(b.peak, b.total-b.free)
	b.mu.Unlock()
}

func (b *budget) release(n int64) {
	n = min(n, b.total)
	b.mu.Lock()
	b.free += n
	b.mu.Unlock()
	b.cond.Broadcast()
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
