package memfs

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
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
	lookups uint64 // the kernel's references on the node
	listed  bool   // in the directory
}

// rawFS answers the kernel at the level of the FUSE protocol: a flat root
// of read-only files. Requests it does not implement are refused by the
// embedded default (ENOSYS).
type rawFS struct {
	fuse.RawFileSystem
	opts    Options
	log     *slog.Logger
	created time.Time

	mu     sync.Mutex
	byName map[string]*export
	byNode map[uint64]*export
	next   uint64 // node ids are never reused

	reads, readBytes, readErrs, stored atomic.Int64
	lastErrLog                         atomic.Int64
}

func newRawFS(opts Options) *rawFS {
	return &rawFS{
		RawFileSystem: fuse.NewDefaultRawFileSystem(), opts: opts, log: opts.Logger, created: time.Now(),
		byName: make(map[string]*export), byNode: make(map[uint64]*export), next: fuse.FUSE_ROOT_ID + 1,
	}
}

func (fs *rawFS) String() string { return "aenvmem" }

func (fs *rawFS) stats() Stats {
	return Stats{Reads: fs.reads.Load(), ReadBytes: fs.readBytes.Load(), ReadErrs: fs.readErrs.Load(), Stored: fs.stored.Load()}
}

func (fs *rawFS) add(name string, src io.ReaderAt, size int64) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if _, ok := fs.byName[name]; ok {
		return fmt.Errorf("memfs: export %q exists", name)
	}
	e := &export{name: name, node: fs.next, src: src, size: size, refs: 1, listed: true}
	fs.next++
	fs.byName[name], fs.byNode[e.node] = e, e
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
	if e.lookups == 0 {
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

func (fs *rawFS) fileAttr(e *export, a *fuse.Attr) {
	fs.commonAttr(a)
	a.Ino, a.Size, a.Blocks = e.node, uint64(e.size), (uint64(e.size)+511)/512
	a.Mode = syscall.S_IFREG | 0o600
	a.Nlink = 1
	a.Owner = fuse.Owner{Uid: fs.opts.UID, Gid: fs.opts.GID}
}

func (fs *rawFS) commonAttr(a *fuse.Attr) {
	t := uint64(fs.created.Unix())
	a.Atime, a.Mtime, a.Ctime = t, t, t
	a.Blksize = 4096
}

func (fs *rawFS) Lookup(_ <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	if h.NodeId != fuse.FUSE_ROOT_ID {
		return fuse.ENOTDIR
	}
	fs.mu.Lock()
	e, ok := fs.byName[name]
	if ok {
		e.lookups++
	}
	fs.mu.Unlock()
	if !ok {
		return fuse.ENOENT
	}
	out.NodeId, out.Generation = e.node, 1
	out.SetEntryTimeout(entryTimeout)
	out.SetAttrTimeout(entryTimeout)
	fs.fileAttr(e, &out.Attr)
	return fuse.OK
}

func (fs *rawFS) Forget(node, n uint64) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	e, ok := fs.byNode[node]
	if !ok {
		return
	}
	e.lookups -= min(n, e.lookups)
	if e.lookups == 0 && !e.listed {
		delete(fs.byNode, node)
	}
}

func (fs *rawFS) GetAttr(_ <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	out.SetTimeout(entryTimeout)
	if in.NodeId == fuse.FUSE_ROOT_ID {
		fs.commonAttr(&out.Attr)
		out.Ino, out.Mode, out.Nlink = fuse.FUSE_ROOT_ID, syscall.S_IFDIR|0o711, 2
		return fuse.OK
	}
	e := fs.node(in.NodeId)
	if e == nil {
		return fuse.ENOENT
	}
	fs.fileAttr(e, &out.Attr)
	return fuse.OK
}

// SetAttr refuses every change: size, mode, owner and times are fixed.
func (fs *rawFS) SetAttr(<-chan struct{}, *fuse.SetAttrIn, *fuse.AttrOut) fuse.Status {
	return fuse.EPERM
}

// Open accepts read-only and read-write opens (QEMU opens its memory file
// read-write) and keeps the page cache; it refuses O_TRUNC.
func (fs *rawFS) Open(_ <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	if fs.node(in.NodeId) == nil {
		return fuse.ENOENT
	}
	if in.Flags&syscall.O_TRUNC != 0 {
		return fuse.EPERM
	}
	out.OpenFlags = fuse.FOPEN_KEEP_CACHE
	return fuse.OK
}

func (fs *rawFS) Read(_ <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	e := fs.node(in.NodeId)
	if e == nil {
		return nil, fuse.ENOENT
	}
	fs.reads.Add(1)
	off := int64(in.Offset)
	if off >= e.size {
		return fuse.ReadResultData(nil), fuse.OK
	}
	n := min(int64(in.Size), e.size-off, int64(len(buf)))
	got, err := e.src.ReadAt(buf[:n], off)
	if err != nil && !(errors.Is(err, io.EOF) && int64(got) == n) {
		fs.readErrs.Add(1)
		fs.logReadError(e, off, n, err)
		return nil, fuse.EIO
	}
	fs.readBytes.Add(n)
	return fuse.ReadResultData(buf[:n]), fuse.OK
}

// logReadError logs a failed read at most once every 10 seconds.
func (fs *rawFS) logReadError(e *export, off, n int64, err error) {
	now, last := time.Now().UnixNano(), fs.lastErrLog.Load()
	if now-last >= int64(10*time.Second) && fs.lastErrLog.CompareAndSwap(last, now) {
		fs.log.Error("memfs: read failed: the reader gets EIO", "export", e.name, "offset", off, "length", n, "err", err)
	}
}

// Write refuses: the bytes behind a mapping never change.
func (fs *rawFS) Write(<-chan struct{}, *fuse.WriteIn, []byte) (uint32, fuse.Status) {
	return 0, fuse.EPERM
}

func (fs *rawFS) Writev(<-chan struct{}, *fuse.WriteIn, [][]byte) (uint32, fuse.Status) {
	return 0, fuse.EPERM
}

func (fs *rawFS) Fallocate(<-chan struct{}, *fuse.FallocateIn) fuse.Status { return fuse.EPERM }

func (fs *rawFS) CopyFileRange(<-chan struct{}, *fuse.CopyFileRangeIn) (uint32, fuse.Status) {
	return 0, fuse.EPERM
}

func (fs *rawFS) Flush(<-chan struct{}, *fuse.FlushIn) fuse.Status { return fuse.OK }
func (fs *rawFS) Fsync(<-chan struct{}, *fuse.FsyncIn) fuse.Status { return fuse.OK }
func (fs *rawFS) Release(<-chan struct{}, *fuse.ReleaseIn)         {}

func (fs *rawFS) OpenDir(_ <-chan struct{}, in *fuse.OpenIn, _ *fuse.OpenOut) fuse.Status {
	if in.NodeId != fuse.FUSE_ROOT_ID {
		return fuse.ENOTDIR
	}
	return fuse.OK
}

// ReadDir lists the exports (for operators; the VMM is given a path).
func (fs *rawFS) ReadDir(_ <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	fs.mu.Lock()
	ents := make([]fuse.DirEntry, 0, len(fs.byName))
	for _, e := range fs.byName {
		ents = append(ents, fuse.DirEntry{Name: e.name, Ino: e.node, Mode: syscall.S_IFREG})
	}
	fs.mu.Unlock()
	slices.SortFunc(ents, func(a, b fuse.DirEntry) int { return cmp.Compare(a.Ino, b.Ino) })
	for i := int(in.Offset); i < len(ents); i++ {
		ents[i].Off = uint64(i + 1)
		if !out.AddDirEntry(ents[i]) {
			break
		}
	}
	return fuse.OK
}

func (fs *rawFS) ReleaseDir(*fuse.ReleaseIn) {}

func (fs *rawFS) StatFs(_ <-chan struct{}, _ *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	out.Bsize, out.Frsize, out.NameLen = 4096, 4096, 255
	return fuse.OK
}

// capsXattr is the attribute every export file carries to fail write(2)
// before it reaches the page cache. Without writeback caching the kernel
// copies written bytes into the cached pages first and sends the write to
// the server after, so a refused write would still change what mappings
// of the page see. A file with file capabilities must lose them on write:
// the kernel asks to remove the attribute before copying anything (for
// root too, unlike the set-user-id bit), and the refusal fails the write.
const capsXattr = "security.capability"

// capsValue is an empty version-2 capability set (magic, then permitted
// and inheritable words, all zero); the mount is noexec, so it grants
// nothing.
var capsValue = []byte{0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}

func (fs *rawFS) GetXAttr(_ <-chan struct{}, h *fuse.InHeader, attr string, dest []byte) (uint32, fuse.Status) {
	if h.NodeId == fuse.FUSE_ROOT_ID || attr != capsXattr {
		return 0, fuse.ENOATTR
	}
	if len(dest) < len(capsValue) {
		return uint32(len(capsValue)), fuse.ERANGE
	}
	return uint32(copy(dest, capsValue)), fuse.OK
}

func (fs *rawFS) ListXAttr(<-chan struct{}, *fuse.InHeader, []byte) (uint32, fuse.Status) {
	return 0, fuse.OK
}

// RemoveXAttr refuses, which is what fails a write (see capsXattr).
func (fs *rawFS) RemoveXAttr(<-chan struct{}, *fuse.InHeader, string) fuse.Status {
	return fuse.EPERM
}

func (fs *rawFS) SetXAttr(<-chan struct{}, *fuse.SetXAttrIn, string, []byte) fuse.Status {
	return fuse.EPERM
}
