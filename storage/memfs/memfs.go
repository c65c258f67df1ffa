package memfs

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

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
	// KeeperSocket, when set, makes the connection outlive this process:
	// a keeper process holds its /dev/fuse descriptor and hands it, over
	// this Unix socket, to the next server that opens the same mount (see
	// keeper.go). Empty: the mount dies with the process.
	KeeperSocket string
	// KeeperCommand runs the keeper (argv; default this executable, which
	// must call RunKeeperIfAsked first thing in main).
	KeeperCommand []string
	Logger        *slog.Logger
}

// Stats count what the mount served.
type Stats struct {
	Reads     int64 // FUSE read requests answered
	ReadBytes int64 // bytes they returned
	ReadErrs  int64 // reads answered with EIO
	Stored    int64 // bytes pushed into the page cache by Prefetch
	Resent    int64 // requests answered that a previous server had read and not answered
}

// Range is a byte range of an export.
type Range struct{ Off, Len int64 }

// Server is one mount serving exports.
type Server struct {
	dir     string
	opts    Options
	log     *slog.Logger
	fs      *rawFS
	c       *conn
	file    *os.File // owns c.fd
	adopted bool
	keeper  *keeperLink // nil without Options.KeeperSocket

	served    sync.WaitGroup
	serveOnce sync.Once
	closeOnce sync.Once
	closeErr  error
}

// Mount opens the mount on dir (Open) and serves it (Serve).
func Mount(dir string, opts Options) (*Server, error) {
	s, err := Open(dir, opts)
	if err != nil {
		return nil, err
	}
	if err := s.Serve(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Open takes over the live connection of dir's mount from the keeper at
// Options.KeeperSocket, when there is one, or else mounts an empty export
// directory on dir (created 0700 if missing; a stale mount of an earlier
// server there is detached first). It needs root (a direct mount(2), no
// fusermount). Nothing is served until Serve: a server that took over a
// connection adds the exports the kernel knows first, so that it can
// answer for them.
func Open(dir string, opts Options) (*Server, error) {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("memfs: mount point %s: %w", dir, err)
	}
	s := &Server{dir: dir, opts: opts, log: opts.Logger, fs: newRawFS(opts), c: &conn{fd: -1, initDone: make(chan struct{})}}
	if opts.KeeperSocket != "" {
		s.keeper = newKeeperLink(s, opts)
		if s.adopt() {
			return s, nil
		}
	}
	if err := s.mount(); err != nil {
		return nil, err
	}
	return s, nil
}

// adopt takes the connection from a live keeper, if it holds one of this
// mount.
func (s *Server) adopt() bool {
	fd, m, kc, err := keeperGet(s.opts.KeeperSocket)
	st := m.State
	if err != nil {
		s.log.Info("memfs: no connection to take over: mounting afresh", "mount", s.dir, "keeper", s.opts.KeeperSocket, "err", err)
		return false
	}
	dev, ok, err := mountDev(s.dir)
	if err != nil || !ok || dev != st.Dev {
		s.log.Warn("memfs: the keeper's connection is not the mount's: dropping it", "mount", s.dir, "keeper_dev", st.Dev, "mount_dev", dev, "err", err)
		keeperQuit(kc)
		unix.Close(fd)
		return false
	}
	s.c.fd, s.c.state, s.file, s.adopted = fd, st, os.NewFile(uintptr(fd), "/dev/fuse"), true
	s.c.initOnce.Do(func() { close(s.c.initDone) })
	s.fs.keepNodes = true
	s.keeper.conn = kc
	s.log.Info("memfs: took over the connection of a previous server", "mount", s.dir, "dev", st.Dev, "minor", st.Minor)
	return true
}

// mount makes a new mount on dir.
func (s *Server) mount() error {
	if err := detachStale(s.dir, s.log); err != nil {
		return err
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return fmt.Errorf("memfs: mount point %s: %w", s.dir, err)
	}
	fd, err := unix.Open("/dev/fuse", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("memfs: open /dev/fuse: %w", err)
	}
	data := fmt.Sprintf("fd=%d,rootmode=40000,user_id=0,group_id=0,default_permissions,max_read=%d", fd, maxRead)
	if s.opts.UID != 0 {
		// Others only when the VMM is not root: the kernel otherwise
		// refuses every process whose uid is not the mounter's.
		data += ",allow_other"
	}
	flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	if err := unix.Mount("aenv-memfs", s.dir, fsType, flags, data); err != nil {
		unix.Close(fd)
		return fmt.Errorf("memfs: mount %s: %w", s.dir, err)
	}
	dev, ok, err := mountDev(s.dir)
	if err != nil || !ok {
		unix.Unmount(s.dir, unix.MNT_DETACH)
		unix.Close(fd)
		return fmt.Errorf("memfs: mount %s: not in mountinfo after mount (%v)", s.dir, err)
	}
	s.c.fd, s.c.state.Dev, s.file = fd, dev, os.NewFile(uintptr(fd), "/dev/fuse")
	return nil
}

// Serve starts answering the kernel. On a new mount it waits for INIT
// and then hands the connection to a keeper (started before it returns);
// on a taken-over one it first
// asks the kernel to resend what the previous server left unanswered.
func (s *Server) Serve() error {
	var err error
	s.serveOnce.Do(func() {
		for range readers {
			s.served.Add(1)
			go s.serve(&s.served)
		}
		if s.adopted {
			if err = s.resend(); err != nil {
				s.log.Error("memfs: resend", "mount", s.dir, "err", err)
				err = nil // later requests are served; the lost ones hang
			}
		} else {
			<-s.c.initDone
		}
		s.learnNoPoll()
		if s.keeper != nil {
			// The first keeper before Serve returns: from then on, a
			// kill of this process leaves the mount to the next server.
			s.keeper.start()
			go s.keeper.run()
		}
		if e := s.setReadAhead(); e != nil {
			// Slower cold faults, still correct bytes: not fatal.
			s.log.Warn("memfs: read_ahead_kb left at the kernel's default", "mount", s.dir, "err", e)
		}
	})
	return err
}

// learnNoPoll polls the hidden pollName file once (see there).
func (s *Server) learnNoPoll() {
	fd, err := unix.Open(filepath.Join(s.dir, pollName), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		s.log.Warn("memfs: open the poll file: a serving process must not open its own exports with os.Open", "mount", s.dir, "err", err)
		return
	}
	defer unix.Close(fd)
	unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
}

// Adopted says whether Open took over a previous server's connection.
func (s *Server) Adopted() bool { return s.adopted }

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
	if err := s.deleteEntry(node, name); err != nil && !errors.Is(err, unix.ENOENT) {
		s.log.Debug("memfs: entry invalidation", "export", name, "err", err)
	}
	return nil
}

// Close stops the keeper (the connection now ends with this process),
// unmounts and stops serving. A mount still in use is detached lazily
// (logged): its users keep it until they close it, served while this
// process lives.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		if s.keeper != nil {
			s.keeper.stop()
		}
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
		s.served.Wait()
		s.file.Close()
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
	return os.WriteFile("/sys/class/bdi/"+s.c.negotiated().Dev+"/read_ahead_kb", []byte(strconv.Itoa(kb)), 0)
}

// ReadAheadKB returns the mount's current read_ahead_kb.
func (s *Server) ReadAheadKB() (int, error) {
	b, err := os.ReadFile("/sys/class/bdi/" + s.c.negotiated().Dev + "/read_ahead_kb")
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
	_, ok, err := mountDev(dir)
	return ok, err
}

// mountDev returns the device (major:minor) of the memfs mount on dir
// (the last one, if stacked), read from mountinfo: a stat(2) of the mount
// point would ask the server, which may not be serving.
func mountDev(dir string) (string, bool, error) {
	mounts, err := memfsMounts()
	if err != nil {
		return "", false, err
	}
	dev, ok := "", false
	for _, m := range mounts {
		if m.dir == dir {
			dev, ok = m.dev, true
		}
	}
	return dev, ok, nil
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
type mountEntry struct{ dir, dev string }

func memfsMounts() ([]mountEntry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mountEntry
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
		out = append(out, mountEntry{dir: unescapeMount(fields[4]), dev: fields[2]})
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
	if name == "" || name == "." || name == ".." || name == pollName || len(name) > 255 || strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("memfs: bad export name %q", name)
	}
	return nil
}
