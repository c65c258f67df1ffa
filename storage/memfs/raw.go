package memfs

import (
	"cmp"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// entryTimeout is how long the kernel may trust a name or attributes: the
// bytes and size never change, and a removed name is invalidated by a
// notification, so long is right.
const entryTimeout = time.Hour

// export is one file of the mount.
type export struct {
	name string
	node uint64
	src  io.ReaderAt
	size int64

	refs    int    // Add/Hold minus Release
	lookups uint64 // the kernel's references on the node (as this server saw them)
	listed  bool   // in the directory
}

// nodeID is the node id (and inode number) of export name: a hash of the
// name, so a server that adopts a connection answers for the nodes the
// kernel learned from the one before it. Export names carry a nonce, so a
// name, and with it its id, is never reused for other bytes.
func nodeID(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	id := h.Sum64() &^ uniqueResent // keep clear of the top bit: 63 bits are plenty
	if id <= pollID {
		id += pollID + 1
	}
	return id
}

// pollName is a hidden empty file (node pollID, not listed) that the
// server polls once at start. Go's os.Open registers every descriptor
// with epoll, which for a FUSE file is a FUSE_POLL request, sent from
// inside the runtime where the thread holds its scheduler slot: a serving
// process that opens its own files could stop the world while its readers
// wait for a slot to answer it. Polling this file first, from a plain
// system call, makes the kernel learn that the server does not implement
// poll (ENOSYS), after which it never asks again on this connection.
const (
	pollName = ".poll"
	pollID   = rootID + 1
)

// rawFS answers the kernel's requests: a flat root of read-only files.
type rawFS struct {
	opts    Options
	log     *slog.Logger
	created time.Time
	// keepNodes: the kernel's lookup counts are unknown (the connection was
	// adopted), so a removed export's node is kept for files still open.
	keepNodes bool

	mu     sync.Mutex
	byName map[string]*export
	byNode map[uint64]*export

	reads, readBytes, readErrs, stored, resent atomic.Int64
	lastErrLog                                 atomic.Int64
}

func newRawFS(opts Options) *rawFS {
	return &rawFS{
		opts: opts, log: opts.Logger, created: time.Now(),
		byName: make(map[string]*export), byNode: make(map[uint64]*export),
	}
}

func (fs *rawFS) stats() Stats {
	return Stats{Reads: fs.reads.Load(), ReadBytes: fs.readBytes.Load(), ReadErrs: fs.readErrs.Load(),
		Stored: fs.stored.Load(), Resent: fs.resent.Load()}
}

func (fs *rawFS) add(name string, src io.ReaderAt, size int64) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if _, ok := fs.byName[name]; ok {
		return fmt.Errorf("memfs: export %q exists", name)
	}
	id := nodeID(name)
	if old, ok := fs.byNode[id]; ok {
		if old.name != name {
			return fmt.Errorf("memfs: export %q: node id %#x taken by %q", name, id, old.name)
		}
		// The same name again (its node still known to the kernel): the
		// same bytes, by the nonce in the name.
		old.src, old.size, old.refs, old.listed = src, size, 1, true
		fs.byName[name] = old
		return nil
	}
	e := &export{name: name, node: id, src: src, size: size, refs: 1, listed: true}
	fs.byName[name], fs.byNode[id] = e, e
	return nil
}

func (fs *rawFS) hold(name string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	e, ok := fs.byName[name]
	if !ok {
		return fmt.Errorf("memfs: hold %q: %w", name, errNoExport)
	}
	e.refs++
	return nil
}

var errNoExport = errors.New("no such export")

// release drops a reference; gone says the name left the directory.
func (fs *rawFS) release(name string) (node uint64, gone bool, err error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	e, ok := fs.byName[name]
	if !ok {
		return 0, false, fmt.Errorf("memfs: release %q: %w", name, errNoExport)
	}
	if e.refs--; e.refs > 0 {
		return e.node, false, nil
	}
	delete(fs.byName, name)
	e.listed = false
	if e.lookups == 0 && !fs.keepNodes {
		delete(fs.byNode, e.node)
	}
	return e.node, true, nil
}

func (fs *rawFS) lookupExport(name string) (*export, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	e, ok := fs.byName[name]
	if !ok {
		return nil, fmt.Errorf("memfs: %q: %w", name, errNoExport)
	}
	return e, nil
}

func (fs *rawFS) node(id uint64) *export {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.byNode[id]
}

func (fs *rawFS) fileAttr(e *export) attr {
	return attr{
		ino: e.node, size: uint64(e.size), blocks: (uint64(e.size) + 511) / 512,
		time: uint64(fs.created.Unix()), mode: syscall.S_IFREG | 0o600, nlink: 1,
		uid: fs.opts.UID, gid: fs.opts.GID, blksize: 4096,
	}
}

func (fs *rawFS) rootAttr() attr {
	return attr{ino: rootID, time: uint64(fs.created.Unix()), mode: syscall.S_IFDIR | 0o711, nlink: 2, blksize: 4096}
}

// putTimeout writes a validity (seconds, then nanoseconds at nsecOff).
func putTimeout(b []byte, secOff, nsecOff int) {
	le.PutUint64(b[secOff:], uint64(entryTimeout/time.Second))
	le.PutUint32(b[nsecOff:], 0)
}

func (fs *rawFS) lookup(h inHeader, body []byte) ([]byte, syscall.Errno) {
	if h.nodeid != rootID {
		return nil, syscall.ENOTDIR
	}
	name := cstring(body)
	if name == pollName {
		return fs.entry(pollID, fs.pollAttr()), 0
	}
	fs.mu.Lock()
	e, ok := fs.byName[name]
	if ok {
		e.lookups++
	}
	fs.mu.Unlock()
	if !ok {
		return nil, syscall.ENOENT
	}
	return fs.entry(e.node, fs.fileAttr(e)), 0
}

func (fs *rawFS) entry(node uint64, a attr) []byte {
	out := make([]byte, entryOutSize)
	le.PutUint64(out[0:], node)
	le.PutUint64(out[8:], 1) // generation
	putTimeout(out, 16, 32)  // entry
	putTimeout(out, 24, 36)  // attributes
	a.put(out[40:])
	return out
}

func (fs *rawFS) pollAttr() attr {
	return attr{ino: pollID, time: uint64(fs.created.Unix()), mode: syscall.S_IFREG | 0o400, nlink: 1, blksize: 4096}
}

func (fs *rawFS) forget(node, n uint64) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	e, ok := fs.byNode[node]
	if !ok {
		return
	}
	e.lookups -= min(n, e.lookups)
	if e.lookups == 0 && !e.listed && !fs.keepNodes {
		delete(fs.byNode, node)
	}
}

func (fs *rawFS) batchForget(body []byte) {
	if len(body) < 8 {
		return
	}
	count := le.Uint32(body)
	body = body[8:]
	for i := uint32(0); i < count && len(body) >= 16; i++ {
		fs.forget(le.Uint64(body), le.Uint64(body[8:]))
		body = body[16:]
	}
}

func (fs *rawFS) getattr(h inHeader) ([]byte, syscall.Errno) {
	var a attr
	switch h.nodeid {
	case rootID:
		a = fs.rootAttr()
	case pollID:
		a = fs.pollAttr()
	default:
		e := fs.node(h.nodeid)
		if e == nil {
			return nil, syscall.ENOENT
		}
		a = fs.fileAttr(e)
	}
	out := make([]byte, attrOutSize)
	putTimeout(out, 0, 8)
	a.put(out[16:])
	return out, 0
}

// open accepts read-only and read-write opens (QEMU opens its memory file
// read-write) and keeps the page cache; it refuses O_TRUNC. The file
// handle is always 0: nothing is kept per open, so a server that adopts
// the connection knows every handle the kernel holds.
func (fs *rawFS) open(h inHeader, body []byte) ([]byte, syscall.Errno) {
	if h.nodeid != pollID && fs.node(h.nodeid) == nil {
		return nil, syscall.ENOENT
	}
	if len(body) >= 4 && le.Uint32(body)&syscall.O_TRUNC != 0 {
		return nil, syscall.EPERM
	}
	out := make([]byte, openOutSize)
	le.PutUint32(out[8:], fopenKeepCache)
	return out, 0
}

func (fs *rawFS) opendir(h inHeader) ([]byte, syscall.Errno) {
	if h.nodeid != rootID {
		return nil, syscall.ENOTDIR
	}
	return make([]byte, openOutSize), 0
}

// read fills buf from the export; a read the source cannot serve is EIO.
func (fs *rawFS) read(h inHeader, body, buf []byte) ([]byte, syscall.Errno) {
	if h.nodeid == pollID {
		return nil, 0
	}
	e := fs.node(h.nodeid)
	if e == nil {
		return nil, syscall.ENOENT
	}
	if len(body) < 24 {
		return nil, syscall.EINVAL
	}
	fs.reads.Add(1)
	off, size := int64(le.Uint64(body[8:])), int64(le.Uint32(body[16:]))
	if off >= e.size {
		return nil, 0
	}
	n := min(size, e.size-off, int64(len(buf)))
	got, err := e.src.ReadAt(buf[:n], off)
	if err != nil && !(errors.Is(err, io.EOF) && int64(got) == n) {
		fs.readErrs.Add(1)
		fs.logReadError(e, off, n, err)
		return nil, syscall.EIO
	}
	fs.readBytes.Add(n)
	return buf[:n], 0
}

// logReadError logs a failed read at most once every 10 seconds.
func (fs *rawFS) logReadError(e *export, off, n int64, err error) {
	now, last := time.Now().UnixNano(), fs.lastErrLog.Load()
	if now-last >= int64(10*time.Second) && fs.lastErrLog.CompareAndSwap(last, now) {
		fs.log.Error("memfs: read failed: the reader gets EIO", "export", e.name, "offset", off, "length", n, "err", err)
	}
}

// readdir lists the exports (for operators; the VMM is given a path).
func (fs *rawFS) readdir(h inHeader, body []byte) ([]byte, syscall.Errno) {
	if h.nodeid != rootID {
		return nil, syscall.ENOTDIR
	}
	if len(body) < 24 {
		return nil, syscall.EINVAL
	}
	off, size := le.Uint64(body[8:]), int(le.Uint32(body[16:]))
	fs.mu.Lock()
	ents := make([]*export, 0, len(fs.byName))
	for _, e := range fs.byName {
		ents = append(ents, e)
	}
	fs.mu.Unlock()
	slices.SortFunc(ents, func(a, b *export) int { return cmp.Compare(a.node, b.node) })
	var out []byte
	for i := int(min(off, uint64(len(ents)))); i < len(ents); i++ {
		name := ents[i].name
		n := (direntBaseSize + len(name) + 7) &^ 7
		if len(out)+n > size {
			break
		}
		d := make([]byte, n)
		le.PutUint64(d[0:], ents[i].node)
		le.PutUint64(d[8:], uint64(i+1))
		le.PutUint32(d[16:], uint32(len(name)))
		le.PutUint32(d[20:], syscall.DT_REG)
		copy(d[24:], name)
		out = append(out, d...)
	}
	return out, 0
}

func statfs() []byte {
	out := make([]byte, statfsOutSize)
	le.PutUint32(out[40:], 4096) // bsize
	le.PutUint32(out[44:], 255)  // namelen
	le.PutUint32(out[48:], 4096) // frsize
	return out
}

// capsXattr is the attribute every export file carries to fail write(2)
// before it reaches the page cache. Without writeback caching the kernel
// copies written bytes into the cached pages first and sends the write to
// the server after, so a refused write would still change what mappings
// of the page see. A file with file capabilities must lose them on write:
// the kernel asks to remove the attribute before copying anything (for
// root too, unlike the set-user-id bit), and the refusal fails the write.
// The connection must not take over that removal (no HANDLE_KILLPRIV in
// INIT), or the kernel would not ask.
const capsXattr = "security.capability"

// capsValue is an empty version-2 capability set (magic, then permitted
// and inheritable words, all zero); the mount is noexec, so it grants
// nothing.
var capsValue = []byte{0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

func (fs *rawFS) getxattr(h inHeader, body []byte) ([]byte, syscall.Errno) {
	if len(body) < 8 {
		return nil, syscall.EINVAL
	}
	if h.nodeid == rootID || cstring(body[8:]) != capsXattr {
		return nil, syscall.ENODATA
	}
	size := le.Uint32(body)
	if size == 0 { // the caller asks for the length
		out := make([]byte, 8)
		le.PutUint32(out, uint32(len(capsValue)))
		return out, 0
	}
	if int(size) < len(capsValue) {
		return nil, syscall.ERANGE
	}
	return capsValue, 0
}

func listxattr(body []byte) ([]byte, syscall.Errno) {
	if len(body) >= 4 && le.Uint32(body) == 0 {
		return make([]byte, 8), 0 // no names: length 0
	}
	return nil, 0
}
