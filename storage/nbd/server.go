package nbd

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Export is one named block device served by a Server.
type Export struct {
	Name        string
	Description string
	Backend     Backend
	// ReadOnly refuses WRITE, TRIM and WRITE_ZEROES with EPERM and tells the client.
	ReadOnly bool
}

// Options tune a Server; the zero value is usable.
type Options struct {
	Logger *slog.Logger
	// MaxInFlight bounds requests served concurrently per connection (default 128).
	// The reader stops taking requests off the socket when it is reached.
	MaxInFlight int
	// MaxInFlightBytes bounds the READ/WRITE payload bytes one connection
	// holds at once (default 64 MiB; at least MaxPayload).
	MaxInFlightBytes int64
	// MaxPayload is the largest READ/WRITE accepted (default DefaultMaxPayload).
	MaxPayload uint32
	// PreferredBlock is the advertised preferred block size (default 4096).
	PreferredBlock uint32
	// HandshakeTimeout bounds the whole negotiation phase (default 30 s), so a
	// client that connects and says nothing does not hold a goroutine forever.
	HandshakeTimeout time.Duration
}

func (o *Options) fill() {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 128
	}
	if o.MaxPayload == 0 {
		o.MaxPayload = DefaultMaxPayload
	}
	if o.MaxInFlightBytes <= 0 {
		o.MaxInFlightBytes = 64 << 20
	}
	if o.PreferredBlock == 0 {
		o.PreferredBlock = 4096
	}
	if o.HandshakeTimeout == 0 {
		o.HandshakeTimeout = 30 * time.Second
	}
}

// Server serves a set of exports to any number of connections. An empty export
// name from a client selects the default export (the first one added).
type Server struct {
	opts Options

	mu          sync.Mutex
	exports     map[string]*Export
	defaultName string
	conns       map[*session]struct{}
	closed      bool
	wg          sync.WaitGroup
	transmits   atomic.Int64 // connections that reached the transmission phase

	onTransmit func(*transmitter) // test hook
}

// NewServer returns a server with no exports.
func NewServer(opts Options) *Server {
	opts.fill()
	return &Server{opts: opts, exports: make(map[string]*Export), conns: make(map[*session]struct{})}
}

// Add registers an export. The server never closes its backend; the owner
// does, after Remove.
func (s *Server) Add(e Export) error {
	if e.Backend == nil {
		return fmt.Errorf("add export %q: nil backend", e.Name)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.exports[e.Name]; ok {
		return fmt.Errorf("add export %q: already exists", e.Name)
	}
	s.exports[e.Name] = &e
	if len(s.exports) == 1 {
		s.defaultName = e.Name
	}
	return nil
}

// Remove unregisters an export and closes every connection serving it,
// waiting for their in-flight requests to finish.
func (s *Server) Remove(name string) error {
	s.mu.Lock()
	e, ok := s.exports[name]
	if !ok {
		s.mu.Unlock()
		return fmt.Errorf("remove export %q: not found", name)
	}
	delete(s.exports, name)
	if s.defaultName == name {
		s.defaultName = ""
	}
	var victims []*session
	for c := range s.conns {
		if c.export() == e {
			victims = append(victims, c)
		}
	}
	s.mu.Unlock()
	for _, c := range victims {
		c.close()
		<-c.done
	}
	return nil
}

// Connections returns how many connections are in the transmission phase on the export.
func (s *Server) Connections(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for c := range s.conns {
		if e := c.export(); e != nil && e.Name == name {
			n++
		}
	}
	return n
}

// Transmissions counts connections that completed the handshake since the
// server was made.
func (s *Server) Transmissions() int64 { return s.transmits.Load() }

func (s *Server) lookup(name string) *Export {
	s.mu.Lock()
	defer s.mu.Unlock()
	if name == "" {
		name = s.defaultName
	}
	return s.exports[name]
}

func (s *Server) names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.exports))
	for n := range s.exports {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Serve accepts connections until ctx is done or the listener fails.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			if !isTemporary(err) {
				return fmt.Errorf("nbd accept on %s: %w", ln.Addr(), err)
			}
			// Out of file descriptors and the like: an export must not
			// die of it, so wait and try again.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.opts.Logger.Warn("nbd accept failed; retrying", "addr", ln.Addr(), "err", err, "in", backoff)
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
				return nil
			}
			continue
		}
		backoff = 0
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			if err := s.ServeConn(ctx, c); err != nil {
				s.opts.Logger.Debug("nbd connection ended", "remote", c.RemoteAddr(), "err", err)
			}
		}()
	}
}

func isTemporary(err error) bool {
	var ne net.Error
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) || errors.Is(err, syscall.ENOBUFS) ||
		errors.Is(err, syscall.ENOMEM) || errors.Is(err, syscall.ECONNABORTED) || (errors.As(err, &ne) && ne.Timeout())
}

// Close closes every connection and waits for connection goroutines started by Serve.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	all := make([]*session, 0, len(s.conns))
	for c := range s.conns {
		all = append(all, c)
	}
	s.mu.Unlock()
	for _, c := range all {
		c.close()
	}
	s.wg.Wait()
	return nil
}

// ServeConn runs the handshake and then the transmission phase on one
// connection, and closes it. Protocol violations end the connection and are
// returned; they never affect other connections.
func (s *Server) ServeConn(ctx context.Context, conn net.Conn) error {
	c := &session{srv: s, conn: conn, done: make(chan struct{})}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		conn.Close()
		return errors.New("nbd server closed")
	}
	s.conns[c] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.close()
		close(c.done)
	}()
	stop := context.AfterFunc(ctx, c.close)
	defer stop()

	c.br = bufio.NewReaderSize(conn, 64<<10)
	c.bw = bufio.NewWriterSize(conn, 64<<10)
	conn.SetDeadline(time.Now().Add(s.opts.HandshakeTimeout))
	exp, err := c.handshake()
	if err != nil || exp == nil {
		return err
	}
	conn.SetDeadline(time.Time{})
	s.transmits.Add(1)
	return c.transmit(exp)
}

// session is the state of one client connection.
type session struct {
	srv  *Server
	conn net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
	done chan struct{}

	mu  sync.Mutex
	exp *Export

	closeOnce sync.Once
}

func (c *session) export() *Export {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.exp
}

func (c *session) close() { c.closeOnce.Do(func() { c.conn.Close() }) }

// handshake runs fixed newstyle negotiation. It returns the chosen export, or
// nil with a nil error when the client aborted politely.
func (c *session) handshake() (*Export, error) {
	var hdr [18]byte
	binary.BigEndian.PutUint64(hdr[0:8], magicNBD)
	binary.BigEndian.PutUint64(hdr[8:16], magicOpts)
	binary.BigEndian.PutUint16(hdr[16:18], flagFixedNewstyle|flagNoZeroes)
	if _, err := c.conn.Write(hdr[:]); err != nil {
		return nil, fmt.Errorf("nbd handshake: send greeting: %w", err)
	}
	var cf [4]byte
	if _, err := io.ReadFull(c.br, cf[:]); err != nil {
		return nil, fmt.Errorf("nbd handshake: read client flags: %w", err)
	}
	clientFlags := binary.BigEndian.Uint32(cf[:])
	if clientFlags&^(cflagFixedNewstyle|cflagNoZeroes) != 0 {
		return nil, fmt.Errorf("nbd handshake: unknown client flags %#x", clientFlags)
	}
	noZeroes := clientFlags&cflagNoZeroes != 0
	for range maxOptions {
		exp, done, err := c.option(noZeroes)
		if err != nil || done {
			return exp, err
		}
	}
	return nil, fmt.Errorf("nbd handshake: more than %d options", maxOptions)
}

// option reads and answers one option. done means negotiation is over
// (transmission with exp, or abort with exp == nil).
func (c *session) option(noZeroes bool) (exp *Export, done bool, err error) {
	var hb [optHeaderLen]byte
	if _, err := io.ReadFull(c.br, hb[:]); err != nil {
		return nil, true, fmt.Errorf("nbd handshake: read option: %w", err)
	}
	h, err := parseOptionHeader(hb[:])
	if err != nil {
		return nil, true, fmt.Errorf("nbd handshake: %w", err)
	}
	data := make([]byte, h.length)
	if _, err := io.ReadFull(c.br, data); err != nil {
		return nil, true, fmt.Errorf("nbd handshake: read option %d payload: %w", h.option, err)
	}
	switch h.option {
	case optExportName:
		return c.optExportName(string(data), noZeroes)
	case optAbort:
		c.optReply(h.option, repAck, nil)
		c.bw.Flush()
		return nil, true, nil
	case optList:
		err = c.optList(h.option, data)
	case optInfo, optGo:
		exp, err = c.optInfoGo(h.option, data)
		if exp != nil && h.option == optGo {
			return exp, true, err
		}
	default:
		// STARTTLS, structured replies, meta contexts, extended headers: we
		// speak simple replies only, which every client must accept.
		err = c.optError(h.option, repErrUnsup, "option not supported")
	}
	if err == nil {
		err = c.bw.Flush()
	}
	if err != nil {
		return nil, true, fmt.Errorf("nbd handshake: answer option %d: %w", h.option, err)
	}
	return nil, false, nil
}

func (c *session) optReply(opt, typ uint32, data []byte) error {
	var b [optReplyHdrLen]byte
	binary.BigEndian.PutUint64(b[0:8], magicOptReply)
	binary.BigEndian.PutUint32(b[8:12], opt)
	binary.BigEndian.PutUint32(b[12:16], typ)
	binary.BigEndian.PutUint32(b[16:20], uint32(len(data)))
	c.bw.Write(b[:])
	_, err := c.bw.Write(data)
	return err
}

func (c *session) optError(opt, typ uint32, msg string) error {
	return c.optReply(opt, typ, []byte(msg))
}

func (c *session) optList(opt uint32, data []byte) error {
	if len(data) != 0 {
		return c.optError(opt, repErrInvalid, "NBD_OPT_LIST takes no data")
	}
	for _, n := range c.srv.names() {
		b := binary.BigEndian.AppendUint32(nil, uint32(len(n)))
		if err := c.optReply(opt, repServer, append(b, n...)); err != nil {
			return err
		}
	}
	return c.optReply(opt, repAck, nil)
}

func (c *session) optInfoGo(opt uint32, data []byte) (*Export, error) {
	req, err := parseInfoRequest(data)
	if err != nil {
		return nil, c.optError(opt, repErrInvalid, err.Error())
	}
	e := c.srv.lookup(req.name)
	if e == nil {
		return nil, c.optError(opt, repErrUnknown, "no such export")
	}
	c.optReply(opt, repInfo, c.exportInfo(e))
	for _, typ := range req.infos {
		switch typ {
		case infoName:
			c.optReply(opt, repInfo, append(binary.BigEndian.AppendUint16(nil, infoName), e.Name...))
		case infoDescription:
			c.optReply(opt, repInfo, append(binary.BigEndian.AppendUint16(nil, infoDescription), e.Description...))
		}
	}
	// Block sizes are sent whether asked or not: the protocol allows it, and
	// it tells clients our maximum payload.
	b := binary.BigEndian.AppendUint16(nil, infoBlockSize)
	b = binary.BigEndian.AppendUint32(b, 1)
	b = binary.BigEndian.AppendUint32(b, c.srv.opts.PreferredBlock)
	b = binary.BigEndian.AppendUint32(b, c.srv.opts.MaxPayload)
	c.optReply(opt, repInfo, b)
	if err := c.optReply(opt, repAck, nil); err != nil {
		return nil, err
	}
	if opt == optGo {
		return e, c.bw.Flush()
	}
	return nil, nil
}

func (c *session) exportInfo(e *Export) []byte {
	b := binary.BigEndian.AppendUint16(nil, infoExport)
	b = binary.BigEndian.AppendUint64(b, uint64(e.Backend.Size()))
	return binary.BigEndian.AppendUint16(b, transmissionFlags(e))
}

func (c *session) optExportName(name string, noZeroes bool) (*Export, bool, error) {
	e := c.srv.lookup(name)
	if e == nil {
		// The old-style option has no error reply: closing is the answer.
		return nil, true, fmt.Errorf("nbd handshake: export %q not found", name)
	}
	b := binary.BigEndian.AppendUint64(nil, uint64(e.Backend.Size()))
	b = binary.BigEndian.AppendUint16(b, transmissionFlags(e))
	if !noZeroes {
		b = append(b, make([]byte, 124)...)
	}
	c.bw.Write(b)
	if err := c.bw.Flush(); err != nil {
		return nil, true, fmt.Errorf("nbd handshake: export name reply: %w", err)
	}
	return e, true, nil
}

func transmissionFlags(e *Export) uint16 {
	f := tflagHasFlags | tflagSendFlush | tflagSendFUA | tflagCanMultiConn
	if e.ReadOnly {
		return f | tflagReadOnly
	}
	return f | tflagSendTrim | tflagSendWriteZero
}
