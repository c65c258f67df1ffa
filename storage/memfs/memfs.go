package memfs

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// fsType is the mount's file system type as /proc/self/mountinfo shows it.
const fsType = "fuse.aenvmem"

// DefaultReadAheadKB is the mount's read_ahead_kb unless Options say
// otherwise: a cold fault reads the 1 MiB around it in one FUSE request.
const DefaultReadAheadKB = 1024

// maxRead is the largest FUSE read request (and notify-store chunk).
const maxRead = 1 << 20

// Options configure a mount.
type Options struct {
	// UID and GID own every export file: the identity the VMM runs as
	// (default root). A non-root UID makes the mount allow other users,
	// which the files' modes (0600) then restrict to that UID.
	UID, GID uint32
	// ReadAheadKB is the mount's bdi read_ahead_kb; 0 is
	// DefaultReadAheadKB, negative leaves the kernel's (128).
	ReadAheadKB int
	Logger      *slog.Logger
}

// Stats count what the mount served.
type Stats struct {
	Reads     int64 // FUSE read requests answered
	ReadBytes int64 // bytes they returned
	ReadErrs  int64 // reads answered with EIO
	Stored    int64 // bytes pushed into the page cache by Prefetch
}

// Range is a byte range of an export.
type Range struct{ Off, Len int64 }

// Server is one mount serving exports.
type Server struct {
	dir  string
	opts Options
	log  *slog.Logger
	srv  *fuse.Server
	fs   *rawFS
	done chan struct{} // closed when the serve loop returns

	closeOnce sync.Once
	closeErr  error
}

// Mount mounts an empty export directory on dir (created 0700 if missing;
// a stale mount of an earlier server there is detached first) and serves
// it until Close. It needs root (a direct mount(2), no fusermount).
func Mount(dir string, opts Options) (*Server, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("memfs: mount point %s: %w", dir, err)
	}
	if err := detachStale(dir, opts.Logger); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("memfs: mount point %s: %w", dir, err)
	}
	fs := newRawFS(opts)
	mo := &fuse.MountOptions{
		FsName: "aenv-memfs", Name: "aenvmem",
		DirectMountStrict: true,
		// Others only when the VMM is not root: the kernel otherwise
		// refuses every process whose uid is not the mounter's.
		AllowOther: opts.UID != 0,
		Options:    []string{"default_permissions", "noexec"},
		MaxWrite:   maxRead, MaxReadAhead: maxRead,
		DisableReadDirPlus: true, ExplicitDataCacheControl: true,
		// Reads are answered from memory; splicing 1 MiB replies would
		// need pipes larger than the default maximum.
		DisableSplice: true,
		MaxBackground: 64,
		Logger:        log.New(slogWriter{opts.Logger}, "", 0),
	}
	srv, err := fuse.NewServer(fs, dir, mo)
	if err != nil {
		return nil, fmt.Errorf("memfs: mount %s: %w", dir, err)
	}
	s := &Server{dir: dir, opts: opts, log: opts.Logger, srv: srv, fs: fs, done: make(chan struct{})}
	go func() { defer close(s.done); srv.Serve() }()
	if err := srv.WaitMount(); err != nil {
		s.Close()
		return nil, fmt.Errorf("memfs: mount %s: %w", dir, err)
	}
	if err := s.setReadAhead(); err != nil {
		// Slower cold faults, still correct bytes: not fatal.
		s.log.Warn("memfs: read_ahead_kb left at the kernel's default", "mount", dir, "err", err)
	}
	return s, nil
}

// Dir is the mount point.
func (s *Server) Dir() string { return s.dir }

// Path is the file of export name.
func (s *Server) Path(name string) string { return filepath.Join(s.dir, name) }

// Stats returns the counters so far.
func (s *Server) Stats() Stats { return s.fs.stats() }

// Add exports src (size bytes) as the file name, held once, and returns
// its path. The name must be new; src must serve the same bytes for as
// long as the export lives (a failing read is EIO, never other bytes).
func (s *Server) Add(name string, src io.ReaderAt, size int64) (string, error) {
	if err := checkName(name); err != nil {
		return "", err
	}
	if src == nil || size < 0 {
		return "", fmt.Errorf("memfs: add %q: no source or negative size %d", name, size)
	}
	if err := s.fs.add(name, src, size); err != nil {
		return "", err
	}
	return s.Path(name), nil
}

// Hold takes one more reference on export name.
func (s *Server) Hold(name string) error { return s.fs.hold(name) }

// Release drops one reference; the last one removes the file from the
// directory (a file already open or mapped stays readable until the kernel
// forgets it).
func (s *Server) Release(name string) error {
	node, gone, err := s.fs.release(name)
	if err != nil || !gone {
		return err
	}
	// Outside the lock: the kernel may answer with FORGETs, which take it.
	if st := s.srv.DeleteNotify(fuse.FUSE_ROOT_ID, node, name); st != fuse.OK && st != fuse.ENOENT {
		s.log.Debug("memfs: entry invalidation", "export", name, "status", st)
	}
	return nil
}

// Prefetch pushes the given ranges of export name into the page cache
// (FUSE_NOTIFY_STORE), widened to whole pages and clipped to the file, and
// returns the bytes stored. Pages already cached are rewritten with the
// same bytes.
func (s *Server) Prefetch(name string, ranges []Range) (int64, error) {
	e, err := s.fs.lookupExport(name)
	if err != nil {
		return 0, err
	}
	// The kernel stores pages only into an inode it knows: look it up.
	if _, err := os.Stat(s.Path(name)); err != nil {
		return 0, fmt.Errorf("memfs: prefetch %q: %w", name, err)
	}
	page := int64(os.Getpagesize())
	buf := make([]byte, maxRead)
	var stored int64
	for _, r := range ranges {
		if r.Off < 0 || r.Len < 0 {
			return stored, fmt.Errorf("memfs: prefetch %q: bad range %d+%d", name, r.Off, r.Len)
		}
		off, end := r.Off/page*page, min(e.size, (r.Off+r.Len+page-1)/page*page)
		for off < end {
			n := min(end-off, int64(len(buf)))
			if _, err := e.src.ReadAt(buf[:n], off); err != nil && !(errors.Is(err, io.EOF) && off+n == e.size) {
				return stored, fmt.Errorf("memfs: prefetch %q at %d: %w", name, off, err)
			}
			if st := s.srv.InodeNotifyStoreCache(e.node, off, buf[:n]); st != fuse.OK {
				return stored, fmt.Errorf("memfs: prefetch %q at %d: notify store: %w", name, off, syscall.Errno(st))
			}
			stored += n
			s.fs.stored.Add(n)
			off += n
		}
	}
	return stored, nil
}

// Close unmounts and stops serving. A mount still in use is detached
// lazily (logged): its users keep it until they close it.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		err := unix.Unmount(s.dir, 0)
		if errors.Is(err, unix.EBUSY) {
			s.log.Warn("memfs: mount in use, detached lazily; its users' reads fail once this process is gone", "mount", s.dir)
			err = unix.Unmount(s.dir, unix.MNT_DETACH)
			if err == nil {
				return // the serve loop ends with the last user
			}
		}
		if err != nil {
			s.closeErr = fmt.Errorf("memfs: unmount %s: %w", s.dir, err)
			return
		}
		<-s.done
	})
	return s.closeErr
}

// setReadAhead raises the mount's bdi read_ahead_kb.
func (s *Server) setReadAhead() error {
	kb := s.opts.ReadAheadKB
	if kb < 0 {
		return nil
	}
	if kb == 0 {
		kb = DefaultReadAheadKB
	}
	var st unix.Stat_t
	if err := unix.Stat(s.dir, &st); err != nil {
		return err
	}
	bdi := fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev))
	return os.WriteFile(bdi, []byte(strconv.Itoa(kb)), 0)
}

// ReadAheadKB returns the mount's current read_ahead_kb.
func (s *Server) ReadAheadKB() (int, error) {
	var st unix.Stat_t
	if err := unix.Stat(s.dir, &st); err != nil {
		return 0, err
	}
	b, err := os.ReadFile(fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev)))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// Mounted reports whether dir is a memfs mount point (for tests and
// recovery).
func Mounted(dir string) (bool, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return false, err
	}
	mounts, err := memfsMounts()
	if err != nil {
		return false, err
	}
	for _, m := range mounts {
		if m == dir {
			return true, nil
		}
	}
	return false, nil
}

// detachStale lazily unmounts a memfs mount left on dir by a server that
// is gone (its files would answer ENOTCONN).
func detachStale(dir string, log *slog.Logger) error {
	ok, err := Mounted(dir)
	if err != nil || !ok {
		return err
	}
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("memfs: detach stale mount %s: %w", dir, err)
	}
	log.Warn("memfs: detached a stale mount of an earlier server", "mount", dir)
	return nil
}

// memfsMounts lists this mount namespace's memfs mount points.
func memfsMounts() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// id parent maj:min root mountpoint opts [optional...] - fstype source superopts
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep < 5 || sep+1 >= len(fields) || fields[sep+1] != fsType {
			continue
		}
		out = append(out, unescapeMount(fields[4]))
	}
	return out, sc.Err()
}

// unescapeMount decodes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func checkName(name string) error {
	if name == "" || name == "." || name == ".." || len(name) > 255 || strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("memfs: bad export name %q", name)
	}
	return nil
}

// slogWriter passes go-fuse's log lines to slog.
type slogWriter struct{ l *slog.Logger }

func (w slogWriter) Write(p []byte) (int, error) {
	w.l.Warn("memfs: fuse", "msg", strings.TrimSpace(string(p)))
	return len(p), nil
}
