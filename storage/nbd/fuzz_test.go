package nbd

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"
)

// scriptConn is a net.Conn whose client side is a fixed byte script: reads
// return the script then EOF, writes are counted and dropped.
type scriptConn struct {
	r       *bytes.Reader
	written int
}

func (c *scriptConn) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c *scriptConn) Write(p []byte) (int, error)      { c.written += len(p); return len(p), nil }
func (c *scriptConn) Close() error                     { return nil }
func (c *scriptConn) LocalAddr() net.Addr              { return &net.UnixAddr{Name: "fuzz", Net: "unix"} }
func (c *scriptConn) RemoteAddr() net.Addr             { return &net.UnixAddr{Name: "fuzz", Net: "unix"} }
func (c *scriptConn) SetDeadline(time.Time) error      { return nil }
func (c *scriptConn) SetReadDeadline(time.Time) error  { return nil }
func (c *scriptConn) SetWriteDeadline(time.Time) error { return nil }

// validSession builds a well-formed client stream: flags, LIST, INFO, GO, a
// few requests and DISC. Fuzzing mutates it.
func validSession() []byte {
	var b []byte
	b = binary.BigEndian.AppendUint32(b, cflagFixedNewstyle|cflagNoZeroes)
	opt := func(o uint32, data []byte) {
		b = binary.BigEndian.AppendUint64(b, magicOpts)
		b = binary.BigEndian.AppendUint32(b, o)
		b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
		b = append(b, data...)
	}
	opt(optList, nil)
	opt(optStructured, nil)
	opt(optInfo, appendInfoRequest(nil, "d", infoName, infoDescription, infoBlockSize))
	opt(optGo, appendInfoRequest(nil, "", infoBlockSize))
	req := func(typ, flags uint16, off uint64, n uint32, payload []byte) {
		h := make([]byte, requestLen)
		putRequest(h, request{flags: flags, typ: typ, handle: uint64(len(b)), offset: off, length: n})
		b = append(append(b, h...), payload...)
	}
	req(cmdWrite, cmdFlagFUA, 512, 8, []byte("abcdefgh"))
	req(cmdRead, 0, 0, 4096, nil)
	req(cmdTrim, 0, 0, 4096, nil)
	req(cmdWriteZeroes, 0, 8192, 4096, nil)
	req(cmdFlush, 0, 0, 0, nil)
	req(cmdRead, 0, 1<<20, 1, nil)
	req(cmdDisc, 0, 0, 0, nil)
	return b
}

// FuzzServeConn feeds arbitrary client bytes through the whole handshake and
// transmission phase. The server must return (never panic or hang).
func FuzzServeConn(f *testing.F) {
	f.Add(validSession())
	f.Add([]byte{0, 0, 0, 3})
	s := validSession()
	f.Add(s[:len(s)/2])
	exportName := binary.BigEndian.AppendUint32(nil, cflagFixedNewstyle)
	exportName = binary.BigEndian.AppendUint64(exportName, magicOpts)
	exportName = binary.BigEndian.AppendUint32(exportName, optExportName)
	exportName = binary.BigEndian.AppendUint32(exportName, 1)
	f.Add(append(exportName, 'd'))
	f.Fuzz(func(t *testing.T, script []byte) {
		srv := NewServer(Options{Logger: discardLogger(), MaxInFlight: 4, MaxPayload: 1 << 20})
		srv.Add(Export{Name: "d", Backend: NewMem(1 << 20)})
		srv.Add(Export{Name: "ro", Backend: NewMem(64 << 10), ReadOnly: true})
		c := &scriptConn{r: bytes.NewReader(script)}
		srv.ServeConn(context.Background(), c)
		if c.written < 18 {
			t.Fatalf("server wrote %d bytes, less than its greeting", c.written)
		}
	})
}

// FuzzParseRequest checks the request decoder against the encoder.
func FuzzParseRequest(f *testing.F) {
	h := make([]byte, requestLen)
	putRequest(h, request{typ: cmdRead, handle: 1, offset: 4096, length: 512})
	f.Add(h)
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := parseRequest(b)
		if err != nil {
			return
		}
		out := make([]byte, requestLen)
		putRequest(out, r)
		if !bytes.Equal(out, b[:requestLen]) {
			t.Fatalf("re-encoding %x gives %x", b[:requestLen], out)
		}
	})
}

// FuzzParseInfoRequest checks the NBD_OPT_INFO/GO payload decoder.
func FuzzParseInfoRequest(f *testing.F) {
	f.Add(appendInfoRequest(nil, "disk", infoBlockSize, infoName))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := parseInfoRequest(b)
		if err != nil {
			return
		}
		if got := appendInfoRequest(nil, r.name, r.infos...); !bytes.Equal(got, b) {
			t.Fatalf("re-encoding %x gives %x", b, got)
		}
	})
}

func discardLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }
