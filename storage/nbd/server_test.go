package nbd

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// serve starts a server with the exports on a Unix socket (or loopback TCP)
// and returns the network and address.
func serve(t *testing.T, network string, exports ...Export) (*Server, string) {
	t.Helper()
	srv := NewServer(Options{})
	for _, e := range exports {
		if err := srv.Add(e); err != nil {
			t.Fatal(err)
		}
	}
	var ln net.Listener
	var err error
	if network == "unix" {
		ln, err = net.Listen("unix", filepath.Join(t.TempDir(), "nbd.sock"))
	} else {
		ln, err = net.Listen("tcp", "127.0.0.1:0")
	}
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx, ln); close(done) }()
	t.Cleanup(func() { cancel(); <-done; srv.Close() })
	return srv, ln.Addr().String()
}

func dial(t *testing.T, network, addr, name string) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, network, addr, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func fileBackend(t *testing.T, size int64) *FileBackend {
	t.Helper()
	p := filepath.Join(t.TempDir(), "disk.raw")
	if err := os.WriteFile(p, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p, size); err != nil {
		t.Fatal(err)
	}
	b, err := OpenFile(p, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

func TestReadWriteConcurrent(t *testing.T) {
	t.Parallel()
	const size = 8 << 20
	cases := []struct {
		name    string
		network string
		backend func(t *testing.T) Backend
	}{
		{"mem-unix", "unix", func(t *testing.T) Backend { return NewMem(size) }},
		{"file-unix", "unix", func(t *testing.T) Backend { return fileBackend(t, size) }},
		{"file-tcp", "tcp", func(t *testing.T) Backend { return fileBackend(t, size) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := tc.backend(t)
			_, addr := serve(t, tc.network, Export{Name: "disk", Backend: b})
			c := dial(t, tc.network, addr, "disk")
			if c.Size() != size || c.ReadOnly() || !c.CanMultiConn() {
				t.Fatalf("size %d readonly %v multiconn %v", c.Size(), c.ReadOnly(), c.CanMultiConn())
			}
			// 64 goroutines each own a disjoint 128 KiB stripe, so replies
			// arrive out of order on one connection.
			want := make([]byte, size)
			var wg sync.WaitGroup
			for g := range 64 {
				wg.Go(func() {
					r := rand.New(rand.NewPCG(uint64(g), 1))
					base := int64(g) * (size / 64)
					for range 16 {
						off := base + int64(r.IntN(size/64-8192))
						p := make([]byte, 1+r.IntN(8191))
						for i := range p {
							p[i] = byte(r.Uint32())
						}
						if _, err := c.WriteAt(p, off); err != nil {
							t.Error(err)
							return
						}
						copy(want[off:], p)
						got := make([]byte, len(p))
						if _, err := c.ReadAt(got, off); err != nil || !bytes.Equal(got, p) {
							t.Errorf("read-back at %d: err %v equal %v", off, err, bytes.Equal(got, p))
							return
						}
					}
				})
			}
			wg.Wait()
			if err := c.Flush(); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, size)
			if _, err := c.ReadAt(got, 0); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatal("whole-disk read differs from what was written")
			}
			direct := make([]byte, size)
			if _, err := b.ReadAt(direct, 0); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(direct, want) {
				t.Fatal("backend content differs from what was written over NBD")
			}
		})
	}
}

func TestTrimZeroFUA(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"mem", "file"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			var b Backend = NewMem(1 << 20)
			if kind == "file" {
				b = fileBackend(t, 1<<20)
			}
			_, addr := serve(t, "unix", Export{Name: "d", Backend: b})
			c := dial(t, "unix", addr, "d")
			ones := bytes.Repeat([]byte{0xff}, 1<<20)
			if _, err := c.WriteAtFUA(ones, 0); err != nil {
				t.Fatal(err)
			}
			if err := c.Trim(0, 256<<10); err != nil {
				t.Fatal(err)
			}
			if err := c.WriteZeroes(512<<10, 4096); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, 1<<20)
			if _, err := c.ReadAt(got, 0); err != nil {
				t.Fatal(err)
			}
			// Trim on both backends frees the range, so it reads as zeroes.
			for i, v := range got {
				zero := i < 256<<10 || (i >= 512<<10 && i < 512<<10+4096)
				if zero != (v == 0) {
					t.Fatalf("byte %d = %#x, want zero=%v", i, v, zero)
				}
			}
		})
	}
}

func TestErrors(t *testing.T) {
	t.Parallel()
	const size = 1 << 20
	ro := NewMem(size)
	ro.WriteAt([]byte("hello"), 0)
	_, addr := serve(t, "unix",
		Export{Name: "rw", Backend: NewMem(size)},
		Export{Name: "ro", Backend: ro, ReadOnly: true})
	rw := dial(t, "unix", addr, "rw")
	roc := dial(t, "unix", addr, "ro")
	if !roc.ReadOnly() {
		t.Fatal("read-only export not flagged read-only")
	}
	cases := []struct {
		name string
		op   func() error
		want uint32
	}{
		{"read past end", func() error { _, err := rw.ReadAt(make([]byte, 8192), size-4096); return err }, errInval},
		{"read huge offset", func() error { _, err := rw.ReadAt(make([]byte, 1), 1<<62); return err }, errInval},
		{"write past end", func() error { _, err := rw.WriteAt(make([]byte, 8192), size-4096); return err }, errNoSpc},
		{"trim past end", func() error { return rw.Trim(size, 1) }, errNoSpc},
		{"write read-only", func() error { _, err := roc.WriteAt([]byte("x"), 0); return err }, errPerm},
		{"trim read-only", func() error { return roc.Trim(0, 4096) }, errPerm},
		{"zero read-only", func() error { return roc.WriteZeroes(0, 4096) }, errPerm},
		{"unknown command", func() error { return rw.do(42, 0, 0, 0, nil, nil) }, errInval},
	}
	for _, tc := range cases {
		err := tc.op()
		var en ErrnoError
		if !errors.As(err, &en) || uint32(en) != tc.want {
			t.Errorf("%s: err %v, want errno %d", tc.name, err, tc.want)
		}
	}
	// The connections survive errors: a valid read still works.
	got := make([]byte, 5)
	if _, err := roc.ReadAt(got, 0); err != nil || string(got) != "hello" {
		t.Fatalf("read after errors: %q %v", got, err)
	}
}

func TestListAndDefaultExport(t *testing.T) {
	t.Parallel()
	_, addr := serve(t, "unix", Export{Name: "a", Backend: NewMem(4096)}, Export{Name: "b", Backend: NewMem(8192)})
	names, err := List(context.Background(), "unix", addr)
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 2 || names[0] != "a" || names[1] != "b" {
		t.Fatalf("list = %v", names)
	}
	if c := dial(t, "unix", addr, ""); c.Size() != 4096 {
		t.Fatalf("default export size %d, want the first export's 4096", c.Size())
	}
	if _, err := Dial(context.Background(), "unix", addr, "missing"); err == nil {
		t.Fatal("opening a missing export succeeded")
	}
}

func TestMultiConnAndRemove(t *testing.T) {
	t.Parallel()
	b := NewMem(1 << 20)
	srv, addr := serve(t, "unix", Export{Name: "d", Backend: b})
	c1 := dial(t, "unix", addr, "d")
	c2 := dial(t, "unix", addr, "d")
	if _, err := c1.WriteAt([]byte("shared"), 100); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 6)
	if _, err := c2.ReadAt(got, 100); err != nil || string(got) != "shared" {
		t.Fatalf("second connection reads %q %v", got, err)
	}
	if n := srv.Connections("d"); n != 2 {
		t.Fatalf("connections = %d, want 2", n)
	}
	if err := srv.Remove("d"); err != nil {
		t.Fatal(err)
	}
	if _, err := c1.ReadAt(got, 0); err == nil {
		t.Fatal("read on a removed export succeeded")
	}
	if _, err := Dial(context.Background(), "unix", addr, "d"); err == nil {
		t.Fatal("opening a removed export succeeded")
	}
}

// rawConn performs the handshake by hand so tests can then misbehave.
func rawConn(t *testing.T, addr string, export string) net.Conn {
	t.Helper()
	conn, err := net.Dial("unix", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	io.ReadFull(conn, make([]byte, 18))
	if export == "-" {
		return conn // the caller sends its own client flags
	}
	conn.Write(binary.BigEndian.AppendUint32(nil, cflagFixedNewstyle|cflagNoZeroes))
	if export == "" {
		return conn
	}
	sendOption(conn, optExportName, []byte(export))
	if _, err := io.ReadFull(conn, make([]byte, 10)); err != nil {
		t.Fatalf("export name reply: %v", err)
	}
	return conn
}

// TestHostileClients checks that protocol abuse ends only the offending
// connection and that the server keeps serving others.
func TestHostileClients(t *testing.T) {
	t.Parallel()
	_, addr := serve(t, "unix", Export{Name: "d", Backend: NewMem(1 << 20)})
	req := func(typ uint16, off uint64, length uint32) []byte {
		b := make([]byte, requestLen)
		putRequest(b, request{typ: typ, handle: 7, offset: off, length: length})
		return b
	}
	cases := []struct {
		name   string
		export string
		send   []byte
	}{
		{"bad client flags", "-", binary.BigEndian.AppendUint32(nil, 0xffff0000)},
		{"bad option magic", "", bytes.Repeat([]byte{0x42}, 16)},
		{"huge option length", "", func() []byte {
			b := binary.BigEndian.AppendUint64(nil, magicOpts)
			b = binary.BigEndian.AppendUint32(b, optGo)
			return binary.BigEndian.AppendUint32(b, 0xffffffff)
		}()},
		{"bad request magic", "d", bytes.Repeat([]byte{0x13}, requestLen)},
		{"huge write length", "d", req(cmdWrite, 0, 0xffffffff)},
		{"truncated write payload", "d", append(req(cmdWrite, 0, 4096), 1, 2, 3)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			conn := rawConn(t, addr, tc.export)
			conn.Write(tc.send)
			if cw, ok := conn.(*net.UnixConn); ok && tc.name == "truncated write payload" {
				cw.CloseWrite()
			}
			// The server must close the connection (EOF), possibly after an error reply.
			if _, err := io.Copy(io.Discard, conn); err != nil {
				t.Fatalf("expected the server to close the connection, got %v", err)
			}
		})
	}
	// Huge read lengths get an error reply and the connection stays usable.
	conn := rawConn(t, addr, "d")
	conn.Write(req(cmdRead, 0, 0xffffffff))
	reply := make([]byte, simpleReplyLen)
	if _, err := io.ReadFull(conn, reply); err != nil || binary.BigEndian.Uint32(reply[4:8]) != errInval {
		t.Fatalf("huge read: reply %x err %v", reply, err)
	}
	c := dial(t, "unix", addr, "d")
	if _, err := c.ReadAt(make([]byte, 4096), 0); err != nil {
		t.Fatalf("server stopped serving after hostile clients: %v", err)
	}
}

// TestHandshakeTimeout: a client that connects and says nothing is dropped
// after the handshake timeout instead of holding its goroutine forever.
func TestHandshakeTimeout(t *testing.T) {
	t.Parallel()
	srv := NewServer(Options{HandshakeTimeout: 200 * time.Millisecond})
	srv.Add(Export{Name: "d", Backend: NewMem(4096)})
	a, b := net.Pipe()
	defer a.Close()
	done := make(chan error, 1)
	go func() { done <- srv.ServeConn(context.Background(), b) }()
	io.ReadFull(a, make([]byte, 18)) // greeting
	if err := <-done; err == nil {
		t.Fatal("a silent client completed the handshake")
	}
	if _, err := a.Read(make([]byte, 1)); err == nil {
		t.Fatal("connection still open after the handshake timeout")
	}
}

// flakyListener fails its first Accept with EMFILE, as a process out of file
// descriptors would.
type flakyListener struct {
	net.Listener
	failed bool
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if !l.failed {
		l.failed = true
		return nil, &net.OpError{Op: "accept", Net: "unix", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// TestServeSurvivesAcceptErrors: a transient accept failure does not end the export.
func TestServeSurvivesAcceptErrors(t *testing.T) {
	t.Parallel()
	srv := NewServer(Options{Logger: discardLogger()})
	srv.Add(Export{Name: "d", Backend: NewMem(4096)})
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, &flakyListener{Listener: ln}) }()
	c := dial(t, "unix", sock, "d")
	if c.Size() != 4096 {
		t.Fatalf("size %d", c.Size())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("serve: %v", err)
	}
}

// TestSlowReaderBounded: a client that pipelines many large reads and does
// not read replies makes the server stop taking requests at its per-connection
// byte budget instead of buffering every reply; all replies still arrive.
func TestSlowReaderBounded(t *testing.T) {
	t.Parallel()
	const chunk, budgetBytes, n = 1 << 20, 3 << 20, 40
	srv := NewServer(Options{MaxInFlight: 16, MaxPayload: chunk, MaxInFlightBytes: budgetBytes, Logger: discardLogger()})
	b := NewMem(n * chunk)
	for i := range n {
		b.WriteAt(bytes.Repeat([]byte{byte(i)}, chunk), int64(i)*chunk)
	}
	srv.Add(Export{Name: "d", Backend: b})
	mems := make(chan *budget, 1)
	srv.onTransmit = func(tr *transmitter) { mems <- tr.mem }
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go srv.Serve(ctx, ln)
	conn := rawConn(t, sock, "d")
	conn.SetDeadline(time.Now().Add(60 * time.Second))
	reqs := make([]byte, 0, n*requestLen)
	for i := range n {
		h := make([]byte, requestLen)
		putRequest(h, request{typ: cmdRead, handle: uint64(i), offset: uint64(i) * chunk, length: chunk})
		reqs = append(reqs, h...)
	}
	if _, err := conn.Write(reqs); err != nil {
		t.Fatal(err)
	}
	mem := <-mems
	seen := make(map[uint64]bool)
	hdr := make([]byte, simpleReplyLen)
	data := make([]byte, chunk)
	for range n {
		if _, err := io.ReadFull(conn, hdr); err != nil {
			t.Fatal(err)
		}
		h := binary.BigEndian.Uint64(hdr[8:16])
		if binary.BigEndian.Uint32(hdr[4:8]) != 0 || seen[h] || h >= n {
			t.Fatalf("bad reply %x", hdr)
		}
		seen[h] = true
		if _, err := io.ReadFull(conn, data); err != nil || data[0] != byte(h) || data[chunk-1] != byte(h) {
			t.Fatalf("reply %d data wrong: %v", h, err)
		}
	}
	mem.mu.Lock()
	peak := mem.peak
	mem.mu.Unlock()
	if peak > budgetBytes || peak < chunk {
		t.Fatalf("peak in-flight payload %d, budget %d", peak, budgetBytes)
	}
}
