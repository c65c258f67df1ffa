package memfs

import (
	"errors"
	"fmt"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// ConnState is what a server needs to resume a FUSE connection another
// server initialised: the kernel remembers what INIT negotiated and never
// asks again.
type ConnState struct {
	Minor    uint32 `json:"minor"`     // negotiated protocol minor
	MaxWrite uint32 `json:"max_write"` // largest write the kernel sends (sizes the read buffer)
	Flags    uint64 `json:"flags"`     // negotiated INIT flags
	Dev      string `json:"dev"`       // the mount's device (major:minor), to check it is still this connection's
}

const (
	// maxWrite is the largest write the kernel may send. Writes are all
	// refused; the value only sizes request buffers.
	maxWrite = 128 << 10
	// readers is how many goroutines read requests (each answers the
	// request it read, so it is also how many reads run at once).
	readers = 8
	// initFlags are the INIT flags this server wants: no writeback cache
	// and no HANDLE_KILLPRIV (capsXattr), explicit data cache control
	// (the bytes never change), reads of up to maxRead.
	initFlags = initAsyncRead | initAtomicOTrunc | initBigWrites | initMaxPages | initExplicitInvalData
)

// conn is the server's side of one FUSE connection: its /dev/fuse
// descriptor and what INIT negotiated.
type conn struct {
	fd int

	mu       sync.Mutex
	state    ConnState
	initDone chan struct{} // closed once INIT is answered (or the state adopted)
	initOnce sync.Once
}

func (c *conn) negotiated() ConnState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state
}

// serve reads and answers requests until the connection ends (unmounted
// or aborted: ENODEV).
func (s *Server) serve(wg *sync.WaitGroup) {
	defer wg.Done()
	buf := make([]byte, maxWrite+64<<10)
	data := make([]byte, maxRead)
	for {
		n, err := unix.Read(s.c.fd, buf)
		switch {
		case err == nil:
		case errors.Is(err, unix.EINTR), errors.Is(err, unix.ENOENT), errors.Is(err, unix.EAGAIN):
			continue // interrupted, or a request the kernel withdrew
		case errors.Is(err, unix.ENODEV):
			return
		default:
			s.log.Error("memfs: read a request", "mount", s.dir, "err", err)
			return
		}
		s.handle(buf[:n], data)
	}
}

// handle answers one request.
func (s *Server) handle(msg, data []byte) {
	h, ok := parseInHeader(msg)
	if !ok {
		return
	}
	body := msg[inHeaderSize:]
	if h.unique&uniqueResent != 0 {
		s.fs.resent.Add(1)
	}
	var out []byte
	var errno syscall.Errno
	fs := s.fs
	switch h.opcode {
	case opInit:
		out, errno = s.init(body)
	case opLookup:
		out, errno = fs.lookup(h, body)
	case opForget:
		if len(body) >= 8 {
			fs.forget(h.nodeid, le.Uint64(body))
		}
		return // no reply
	case opBatchForget:
		fs.batchForget(body)
		return
	case opInterrupt:
		return // every request is answered anyway
	case opGetattr:
		out, errno = fs.getattr(h)
	case opOpen:
		out, errno = fs.open(h, body)
	case opRead:
		out, errno = fs.read(h, body, data)
	case opOpendir:
		out, errno = fs.opendir(h)
	case opReaddir:
		out, errno = fs.readdir(h, body)
	case opStatfs:
		out = statfs()
	case opGetxattr:
		out, errno = fs.getxattr(h, body)
	case opListxattr:
		out, errno = listxattr(body)
	case opRelease, opReleasedir, opFlush, opFsync, opFsyncdir, opDestroy:
		// Nothing is kept per open and nothing is ever dirty.
	case opSetattr, opWrite, opSetxattr, opRemovexattr, opFallocate, opCopyFileRng,
		opMknod, opMkdir, opUnlink, opRmdir, opRename, opRename2, opLink, opSymlink, opCreate, opTmpfile:
		// The bytes, names and attributes never change; refusing
		// REMOVEXATTR is what fails a write (capsXattr).
		errno = syscall.EPERM
	default:
		errno = syscall.ENOSYS
	}
	s.reply(h.unique, errno, out)
}

// reply writes the answer to request unique. A request the kernel no
// longer waits for (interrupted, or its caller gone) is ENOENT: fine.
func (s *Server) reply(unique uint64, errno syscall.Errno, out []byte) {
	if errno != 0 {
		out = nil
	}
	var hdr [outHeaderSize]byte
	putOutHeader(hdr[:], outHeaderSize+len(out), -int32(errno), unique)
	if err := s.write(hdr[:], out); err != nil && !errors.Is(err, unix.ENOENT) {
		s.log.Debug("memfs: reply", "unique", unique, "err", err)
	}
}

// write writes one message (header and payload) to the connection.
func (s *Server) write(hdr, payload []byte) error {
	iov := [][]byte{hdr}
	if len(payload) > 0 {
		iov = append(iov, payload)
	}
	for {
		_, err := unix.Writev(s.c.fd, iov)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		return err
	}
}

// notify sends an unsolicited message (unique 0, the code where the error
// goes).
func (s *Server) notify(code int32, payload ...[]byte) error {
	var n int
	for _, p := range payload {
		n += len(p)
	}
	hdr := make([]byte, outHeaderSize, outHeaderSize+n)
	putOutHeader(hdr, outHeaderSize+n, code, 0)
	for _, p := range payload[:max(0, len(payload)-1)] {
		hdr = append(hdr, p...)
	}
	var last []byte
	if len(payload) > 0 {
		last = payload[len(payload)-1]
	}
	return s.write(hdr, last)
}

// init answers FUSE_INIT: protocol 7.x at the lower of the two minors,
// and the flags both sides know.
func (s *Server) init(body []byte) ([]byte, syscall.Errno) {
	if len(body) < 16 {
		return nil, syscall.EINVAL
	}
	major, minor, flags := le.Uint32(body), le.Uint32(body[4:]), uint64(le.Uint32(body[12:]))
	out := make([]byte, initOutSize)
	le.PutUint32(out[0:], protoMajor)
	le.PutUint32(out[4:], protoMinor)
	if major != protoMajor {
		// An older or newer major: say ours, the kernel retries or gives up.
		return out[:8], 0
	}
	minor = min(minor, protoMinor)
	flags &= initFlags
	le.PutUint32(out[4:], minor)
	le.PutUint32(out[8:], maxRead) // max_readahead
	le.PutUint32(out[12:], uint32(flags))
	le.PutUint16(out[16:], 64) // max_background
	le.PutUint16(out[18:], 48) // congestion_threshold
	le.PutUint32(out[20:], maxWrite)
	le.PutUint32(out[24:], 1)               // time_gran
	le.PutUint16(out[28:], maxRead/(4<<10)) // max_pages
	s.c.mu.Lock()
	s.c.state.Minor, s.c.state.MaxWrite, s.c.state.Flags = minor, maxWrite, flags
	s.c.mu.Unlock()
	s.c.initOnce.Do(func() { close(s.c.initDone) })
	return out, 0
}

// resend asks the kernel to queue again every request a server read and
// did not answer (FUSE_NOTIFY_RESEND, protocol 7.40): the requests a dead
// server took with it.
func (s *Server) resend() error {
	if st := s.c.negotiated(); st.Minor < 40 {
		return fmt.Errorf("memfs: protocol 7.%d has no resend: requests the previous server read stay unanswered", st.Minor)
	}
	if err := s.notify(notifyResend); err != nil {
		return fmt.Errorf("memfs: notify resend on %s: %w", s.dir, err)
	}
	return nil
}

// storeCache pushes data into node's page cache at off.
func (s *Server) storeCache(node uint64, off int64, data []byte) error {
	var hdr [24]byte
	le.PutUint64(hdr[0:], node)
	le.PutUint64(hdr[8:], uint64(off))
	le.PutUint32(hdr[16:], uint32(len(data)))
	return s.notify(notifyStore, hdr[:], data)
}

// deleteEntry tells the kernel name left the root (and its node, child).
func (s *Server) deleteEntry(child uint64, name string) error {
	hdr := make([]byte, 24, 24+len(name)+1)
	le.PutUint64(hdr[0:], rootID)
	le.PutUint64(hdr[8:], child)
	le.PutUint32(hdr[16:], uint32(len(name)))
	return s.notify(notifyDelete, append(append(hdr, name...), 0))
}
