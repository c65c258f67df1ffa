package nbd

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// Client is a small NBD client: fixed newstyle with NBD_OPT_GO, simple
// replies, and any number of concurrent requests on one connection. Tests and
// tools use it; VMs use QEMU's own client.
type Client struct {
	conn     net.Conn
	size     int64
	flags    uint16
	maxBlock uint32

	wmu sync.Mutex // serialises request writes

	mu      sync.Mutex
	next    uint64
	pending map[uint64]*call
	err     error // set once the reader stops
	done    chan struct{}
}

type call struct {
	buf  []byte // destination for READ data
	done chan uint32
}

// ErrnoError is an error number returned by the server.
type ErrnoError uint32

func (e ErrnoError) Error() string { return fmt.Sprintf("nbd server error %d", uint32(e)) }

// Dial connects to addr ("unix" socket path or "tcp" host:port) and opens the export.
func Dial(ctx context.Context, network, addr, export string) (*Client, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, fmt.Errorf("nbd dial %s %s: %w", network, addr, err)
	}
	c, err := NewClient(ctx, conn, export)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

// NewClient negotiates export over an open connection.
func NewClient(ctx context.Context, conn net.Conn, export string) (*Client, error) {
	info, br, err := negotiate(ctx, conn, export)
	if err != nil {
		return nil, err
	}
	c := &Client{conn: conn, size: info.Size, flags: info.Flags, maxBlock: info.MaxBlock,
		pending: make(map[uint64]*call), done: make(chan struct{})}
	go c.readLoop(br)
	return c, nil
}

// ExportInfo is what a handshake learns about an export.
type ExportInfo struct {
	Size     int64
	Flags    uint16 // transmission flags
	MaxBlock uint32
}

// Negotiate runs the client side of the handshake on conn and leaves it in
// the transmission phase, for a consumer that speaks the rest itself (the
// kernel NBD driver, see AttachKernel).
func Negotiate(ctx context.Context, conn net.Conn, export string) (ExportInfo, error) {
	info, br, err := negotiate(ctx, conn, export)
	if err == nil && br.Buffered() > 0 {
		err = fmt.Errorf("nbd open %q: server sent data before the first request", export)
	}
	return info, err
}

func negotiate(ctx context.Context, conn net.Conn, export string) (ExportInfo, *bufio.Reader, error) {
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	} else {
		conn.SetDeadline(time.Now().Add(30 * time.Second))
	}
	defer conn.SetDeadline(time.Time{})
	br := bufio.NewReader(conn)
	if err := clientGreeting(conn, br); err != nil {
		return ExportInfo{}, nil, fmt.Errorf("nbd open %q: %w", export, err)
	}
	info, err := goOption(conn, br, export)
	if err != nil {
		return ExportInfo{}, nil, fmt.Errorf("nbd open %q: %w", export, err)
	}
	return info, br, nil
}

func clientGreeting(conn net.Conn, br *bufio.Reader) error {
	var g [18]byte
	if _, err := io.ReadFull(br, g[:]); err != nil {
		return fmt.Errorf("read greeting: %w", err)
	}
	if binary.BigEndian.Uint64(g[0:8]) != magicNBD || binary.BigEndian.Uint64(g[8:16]) != magicOpts {
		return errors.New("not a fixed newstyle NBD server")
	}
	if binary.BigEndian.Uint16(g[16:18])&flagFixedNewstyle == 0 {
		return errors.New("server lacks fixed newstyle")
	}
	_, err := conn.Write(binary.BigEndian.AppendUint32(nil, cflagFixedNewstyle|cflagNoZeroes))
	return err
}

func sendOption(conn net.Conn, opt uint32, data []byte) error {
	b := binary.BigEndian.AppendUint64(nil, magicOpts)
	b = binary.BigEndian.AppendUint32(b, opt)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	_, err := conn.Write(append(b, data...))
	return err
}

// readOptReply returns the reply type and payload of one option reply.
func readOptReply(br *bufio.Reader, opt uint32) (uint32, []byte, error) {
	var h [optReplyHdrLen]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return 0, nil, fmt.Errorf("read option reply: %w", err)
	}
	if binary.BigEndian.Uint64(h[0:8]) != magicOptReply || binary.BigEndian.Uint32(h[8:12]) != opt {
		return 0, nil, errors.New("malformed option reply")
	}
	n := binary.BigEndian.Uint32(h[16:20])
	if n > maxOptionLen {
		return 0, nil, fmt.Errorf("option reply of %d bytes", n)
	}
	data := make([]byte, n)
	if _, err := io.ReadFull(br, data); err != nil {
		return 0, nil, fmt.Errorf("read option reply data: %w", err)
	}
	return binary.BigEndian.Uint32(h[12:16]), data, nil
}

func goOption(conn net.Conn, br *bufio.Reader, export string) (ExportInfo, error) {
	info := ExportInfo{MaxBlock: DefaultMaxPayload}
	if err := sendOption(conn, optGo, appendInfoRequest(nil, export, infoBlockSize)); err != nil {
		return info, err
	}
	for {
		typ, data, err := readOptReply(br, optGo)
		if err != nil {
			return info, err
		}
		switch {
		case typ == repAck:
			if info.Flags == 0 {
				return info, errors.New("server sent no export info")
			}
			return info, nil
		case typ&(1<<31) != 0:
			return info, fmt.Errorf("server refused export: type %#x: %s", typ, data)
		case typ == repInfo && len(data) >= 2:
			info.parse(data)
		}
	}
}

func (info *ExportInfo) parse(data []byte) {
	switch binary.BigEndian.Uint16(data[0:2]) {
	case infoExport:
		if len(data) >= 12 {
			info.Size = int64(binary.BigEndian.Uint64(data[2:10]))
			info.Flags = binary.BigEndian.Uint16(data[10:12])
		}
	case infoBlockSize:
		if len(data) >= 14 {
			info.MaxBlock = max(binary.BigEndian.Uint32(data[10:14]), 512)
		}
	}
}

// List returns the export names a server offers.
func List(ctx context.Context, network, addr string) ([]string, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, fmt.Errorf("nbd list %s: %w", addr, err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(conn)
	if err := clientGreeting(conn, br); err != nil {
		return nil, fmt.Errorf("nbd list %s: %w", addr, err)
	}
	if err := sendOption(conn, optList, nil); err != nil {
		return nil, fmt.Errorf("nbd list %s: %w", addr, err)
	}
	var names []string
	for {
		typ, data, err := readOptReply(br, optList)
		if err != nil {
			return nil, fmt.Errorf("nbd list %s: %w", addr, err)
		}
		switch {
		case typ == repAck:
			sendOption(conn, optAbort, nil)
			return names, nil
		case typ == repServer && len(data) >= 4:
			n := binary.BigEndian.Uint32(data[0:4])
			if uint64(n) <= uint64(len(data)-4) {
				names = append(names, string(data[4:4+n]))
			}
		case typ&(1<<31) != 0:
			return nil, fmt.Errorf("nbd list %s: error reply %#x", addr, typ)
		}
	}
}

// Size is the export size.
func (c *Client) Size() int64 { return c.size }

// ReadOnly reports whether the server marked the export read-only.
func (c *Client) ReadOnly() bool { return c.flags&tflagReadOnly != 0 }

// CanMultiConn reports whether the server allows several connections to one export.
func (c *Client) CanMultiConn() bool { return c.flags&tflagCanMultiConn != 0 }

func (c *Client) readLoop(br *bufio.Reader) {
	var h [simpleReplyLen]byte
	var err error
	for {
		if _, err = io.ReadFull(br, h[:]); err != nil {
			break
		}
		if binary.BigEndian.Uint32(h[0:4]) != magicSimpleReply {
			err = errors.New("nbd client: bad reply magic")
			break
		}
		code, handle := binary.BigEndian.Uint32(h[4:8]), binary.BigEndian.Uint64(h[8:16])
		c.mu.Lock()
		cl := c.pending[handle]
		delete(c.pending, handle)
		c.mu.Unlock()
		if cl == nil {
			err = fmt.Errorf("nbd client: reply for unknown handle %d", handle)
			break
		}
		if code == 0 && len(cl.buf) > 0 {
			if _, err = io.ReadFull(br, cl.buf); err != nil {
				cl.done <- errIO
				break
			}
		}
		cl.done <- code
	}
	c.mu.Lock()
	c.err = fmt.Errorf("nbd client: connection lost: %w", err)
	for h, cl := range c.pending {
		delete(c.pending, h)
		cl.done <- errShutdown
	}
	c.mu.Unlock()
	close(c.done)
}

// do sends one request and waits for its reply.
func (c *Client) do(typ, flags uint16, off int64, length uint32, payload, dst []byte) error {
	cl := &call{buf: dst, done: make(chan uint32, 1)}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return c.err
	}
	c.next++
	h := c.next
	c.pending[h] = cl
	c.mu.Unlock()

	var hdr [requestLen]byte
	putRequest(hdr[:], request{flags: flags, typ: typ, handle: h, offset: uint64(off), length: length})
	c.wmu.Lock()
	bufs := net.Buffers{hdr[:], payload}
	_, err := bufs.WriteTo(c.conn)
	c.wmu.Unlock()
	if err != nil {
		c.conn.Close() // the reader fails every pending call
	}
	if code := <-cl.done; code != 0 {
		if code == errShutdown && c.err != nil {
			return c.err
		}
		return ErrnoError(code)
	}
	return nil
}

// ReadAt reads len(p) bytes at off, split into requests the server accepts.
func (c *Client) ReadAt(p []byte, off int64) (int, error) {
	for done := 0; done < len(p); {
		n := min(len(p)-done, int(c.maxBlock))
		if err := c.do(cmdRead, 0, off+int64(done), uint32(n), nil, p[done:done+n]); err != nil {
			return done, fmt.Errorf("nbd read at %d: %w", off+int64(done), err)
		}
		done += n
	}
	return len(p), nil
}

// WriteAt writes p at off.
func (c *Client) WriteAt(p []byte, off int64) (int, error) { return c.write(p, off, 0) }

// WriteAtFUA writes p at off with forced unit access.
func (c *Client) WriteAtFUA(p []byte, off int64) (int, error) { return c.write(p, off, cmdFlagFUA) }

func (c *Client) write(p []byte, off int64, flags uint16) (int, error) {
	for done := 0; done < len(p); {
		n := min(len(p)-done, int(c.maxBlock))
		if err := c.do(cmdWrite, flags, off+int64(done), uint32(n), p[done:done+n], nil); err != nil {
			return done, fmt.Errorf("nbd write at %d: %w", off+int64(done), err)
		}
		done += n
	}
	return len(p), nil
}

// Flush asks the server to make completed writes durable.
func (c *Client) Flush() error { return c.do(cmdFlush, 0, 0, 0, nil, nil) }

// Trim discards a range.
func (c *Client) Trim(off int64, length uint32) error { return c.do(cmdTrim, 0, off, length, nil, nil) }

// WriteZeroes zeroes a range.
func (c *Client) WriteZeroes(off int64, length uint32) error {
	return c.do(cmdWriteZeroes, 0, off, length, nil, nil)
}

// Close sends NBD_CMD_DISC and closes the connection.
func (c *Client) Close() error {
	var hdr [requestLen]byte
	putRequest(hdr[:], request{typ: cmdDisc})
	c.wmu.Lock()
	c.conn.Write(hdr[:])
	c.wmu.Unlock()
	err := c.conn.Close()
	<-c.done
	return err
}
