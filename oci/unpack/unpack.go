// Package unpack applies OCI image layers (tar streams) to a directory, the
// way a container runtime builds a root filesystem: layers in order, OCI
// whiteouts (".wh.<name>" removes a lower entry, ".wh..wh..opq" hides a
// directory's lower content), hard and symbolic links, ownership, modes with
// setuid/setgid/sticky bits, extended attributes, device nodes and mtimes.
//
// Layer content is untrusted. Every path is resolved inside the root with
// openat2(RESOLVE_IN_ROOT): a symbolic link in the tree (absolute or full of
// "..") is interpreted as if the root were "/", so it can never lead a write
// outside the root; the final component of an entry is always operated on
// with *at system calls on its parent directory without following it. Entry
// names and hard-link targets with ".." components are rejected outright.
// The standard library's os.Root is not used because it refuses to follow
// in-root absolute symbolic links (/var/run -> /run), which real images need.
//
// Unpacking needs root (ownership, device nodes, trusted xattrs).
package unpack

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
	xattrPrefix    = "SCHILY.xattr."
)

// ErrUnsafePath reports an entry name or link target that would escape the root.
var ErrUnsafePath = errors.New("unsafe path")

// Clean turns a tar entry name (or hard-link target) into a clean path
// relative to the root, "." for the root itself. A leading "/" is dropped
// (absolute names are root-relative); names with a ".." component, a NUL
// byte or that are empty are rejected with ErrUnsafePath.
func Clean(name string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("%w: empty name", ErrUnsafePath)
	}
	if strings.IndexByte(name, 0) >= 0 {
		return "", fmt.Errorf("%w: %q contains a NUL byte", ErrUnsafePath, name)
	}
	for _, c := range strings.Split(name, "/") {
		if c == ".." {
			return "", fmt.Errorf("%w: %q contains a \"..\" component", ErrUnsafePath, name)
		}
	}
	p := path.Clean("/" + name)
	if p == "/" {
		return ".", nil
	}
	return p[1:], nil
}

// Root is a directory that layers are applied to.
//
// The limits bound everything all Apply calls on the root do together, for
// entries of every kind, so a hostile image can fill neither the disk, nor
// the inode table, nor the memory of what walks the tree afterwards
// (mke2fs -d). Counts only grow: an inode a later whiteout removes still
// counted.
type Root struct {
	fd   int // O_PATH directory
	path string
	// MaxBytes bounds the bytes of the layers: regular-file sizes as the tar
	// headers declare them (sparse holes included), plus every entry's name,
	// link target and PAX records, plus EntryCost per inode made.
	MaxBytes int64
	// MaxEntries bounds the tar entries of every kind (whiteouts, hard links
	// and PAX global headers included).
	MaxEntries int64
	// MaxInodes bounds the inodes made: files, directories (those made for
	// missing parents too), symbolic links, device nodes and FIFOs. Hard
	// links make none.
	MaxInodes int64
	// MaxPathLen bounds the length of an entry's name and link target.
	MaxPathLen int

	written, entries, inodes int64
}

// OpenRoot opens (creating it if needed) the directory dir as a Root.
func OpenRoot(dir string) (*Root, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("unpack: create root %s: %w", dir, err)
	}
	markTopDir(dir)
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("unpack: open root %s: %w", dir, err)
	}
	return &Root{fd: fd, path: dir}, nil
}

// fsTopDirFlag is FS_TOPDIR_FL (linux/fs.h), not defined by x/sys/unix.
const fsTopDirFlag = 0x00020000

// markTopDir flags dir as the top of a directory hierarchy (chattr +T), a
// hint ext4's allocator takes to spread the directories made right below it
// over block groups with free inodes instead of placing them next to dir. A
// layer makes thousands of inodes, and ext4 without a journal passes over
// every recently freed inode of a group on each allocation: next to a cache
// directory where files come and go, a create was measured at about a
// millisecond against tens of microseconds in a quiet group. Best effort:
// other filesystems refuse the flag, which changes nothing else.
func markTopDir(dir string) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	flags, err := unix.IoctlGetInt(fd, unix.FS_IOC_GETFLAGS)
	if err != nil || flags&fsTopDirFlag != 0 {
		return
	}
	_ = unix.IoctlSetPointerInt(fd, unix.FS_IOC_SETFLAGS, flags|fsTopDirFlag)
}

// Path is the directory the root was opened at.
func (r *Root) Path() string { return r.path }

// Close releases the root.
func (r *Root) Close() error {
	if r.fd < 0 {
		return nil
	}
	err := unix.Close(r.fd)
	r.fd = -1
	return err
}

func (r *Root) openat2(rel string, flags uint64) (int, error) {
	for {
		fd, err := unix.Openat2(r.fd, rel, &unix.OpenHow{
			Flags:   flags | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
		})
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		return fd, err
	}
}

// openDir opens the directory rel (clean, relative) inside the root as an
// O_PATH descriptor. With create, missing components are made (mode 0755,
// owned by root) and reported to made.
func (r *Root) openDir(rel string, create bool, made func(string)) (int, error) {
	fd, err := r.openat2(rel, unix.O_PATH|unix.O_DIRECTORY)
	if err == nil || !create || err != unix.ENOENT {
		return fd, err
	}
	// Walk from the top, creating what is missing.
	parent, err := unix.Dup(r.fd)
	if err != nil {
		return -1, err
	}
	prefix := ""
	for _, c := range strings.Split(rel, "/") {
		if prefix == "" {
			prefix = c
		} else {
			prefix += "/" + c
		}
		fd, err := r.openat2(prefix, unix.O_PATH|unix.O_DIRECTORY)
		if err == unix.ENOENT {
			// parent is the resolved directory of the previous prefix, so
			// mkdirat creates exactly the component that is missing.
			if err := r.newInode(); err != nil {
				unix.Close(parent)
				return -1, err
			}
			merr := unix.Mkdirat(parent, c, 0o755)
			if merr == unix.EEXIST {
				// Only a dangling symbolic link exists yet does not open.
				var st unix.Stat_t
				if unix.Fstatat(parent, c, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
					buf := make([]byte, 4096)
					n, _ := unix.Readlinkat(parent, c, buf)
					unix.Close(parent)
					return -1, fmt.Errorf("%w: %q is a symbolic link to %q, which does not exist inside the root",
						ErrUnsafePath, prefix, buf[:max(n, 0)])
				}
			}
			if merr != nil && merr != unix.EEXIST {
				unix.Close(parent)
				return -1, merr
			}
			if made != nil && merr == nil {
				made(prefix)
			}
			fd, err = r.openat2(prefix, unix.O_PATH|unix.O_DIRECTORY)
		}
		unix.Close(parent)
		if err != nil {
			return -1, err
		}
		parent = fd
	}
	return parent, nil
}

// split returns the parent directory and final component of a clean path.
func split(rel string) (dir, name string) {
	dir, name = path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	if dir == "" {
		dir = "."
	}
	return dir, name
}

// removeAll removes name (and, for a directory, everything below it) from
// the directory dirfd without following symbolic links.
func removeAll(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || err == unix.ENOENT {
		return nil
	}
	if err != unix.EISDIR && err != unix.EPERM {
		return err
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	names, err := f.Readdirnames(-1)
	if err == nil {
		for _, n := range names {
			if err = removeAll(fd, n); err != nil {
				break
			}
		}
	}
	f.Close()
	if err != nil {
		return err
	}
	if err := unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR); err != nil && err != unix.ENOENT {
		return err
	}
	return nil
}

// Stats counts what Apply did.
type Stats struct {
	Entries   int
	Bytes     int64 // regular file content written
	Whiteouts int
}

// layer is the state of one Apply call.
type layer struct {
	r     *Root
	seen  map[string]bool // paths this layer wrote (whiteouts apply to lower layers only)
	dirs  []dirTime       // directory mtimes, set after the layer so later entries don't disturb them
	stats Stats
}

type dirTime struct {
	rel   string
	atime time.Time
	mtime time.Time
}

// Apply reads a tar stream (uncompressed) and applies it to the root as one
// layer on top of what the root holds.
func (r *Root) Apply(ctx context.Context, tr io.Reader) (Stats, error) {
	l := &layer{r: r, seen: map[string]bool{}}
	rd := tar.NewReader(tr)
	for {
		if err := ctx.Err(); err != nil {
			return l.stats, err
		}
		hdr, err := rd.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return l.stats, fmt.Errorf("unpack: read tar header: %w", err)
		}
		if err := l.r.count(hdr); err != nil {
			return l.stats, fmt.Errorf("unpack: tar entry %.200q: %w", hdr.Name, err)
		}
		if err := l.entry(hdr, rd); err != nil {
			return l.stats, fmt.Errorf("unpack: tar entry %.200q: %w", hdr.Name, err)
		}
		l.stats.Entries++
	}
	for _, d := range slices.Backward(l.dirs) {
		if err := l.setTimes(d.rel, d.atime, d.mtime); err != nil {
			return l.stats, fmt.Errorf("unpack: directory %q times: %w", d.rel, err)
		}
	}
	return l.stats, nil
}

func (l *layer) markParents(rel string) {
	for d := rel; d != "."; {
		d, _ = split(d)
		l.seen[d] = true
	}
}

// entry applies one tar entry to the tree: a whiteout, the root's
// metadata, or a new node in place of whatever the path held.
func (l *layer) entry(hdr *tar.Header, rd io.Reader) error {
	if err := checkEntry(hdr); err != nil {
		return err
	}
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	rel, err := Clean(hdr.Name)
	if err != nil {
		return err
	}
	dir, base := split(rel)
	if strings.HasPrefix(base, whiteoutPrefix) {
		if hdr.Typeflag == tar.TypeDir {
			return fmt.Errorf("whiteout is a directory")
		}
		l.stats.Whiteouts++
		return l.whiteout(dir, base)
	}
	if rel == "." {
		if hdr.Typeflag != tar.TypeDir {
			return fmt.Errorf("the root entry is not a directory")
		}
		return l.rootDir(hdr)
	}
	dirfd, err := l.r.openDir(dir, true, func(p string) { l.seen[p] = true })
	if err != nil {
		return fmt.Errorf("open parent directory %q: %w", dir, err)
	}
	defer unix.Close(dirfd)
	l.seen[rel] = true
	l.markParents(rel)

	var st unix.Stat_t
	exists := unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
	isDir := exists && st.Mode&unix.S_IFMT == unix.S_IFDIR
	if exists && !(hdr.Typeflag == tar.TypeDir && isDir) {
		if hdr.Typeflag == tar.TypeLink {
			if target, err := Clean(hdr.Linkname); err == nil && target == rel {
				return nil // a link to itself: keep the file
			}
		}
		if err := removeAll(dirfd, base); err != nil {
			return fmt.Errorf("replace existing entry: %w", err)
		}
	}
	return l.create(dirfd, base, rel, hdr, rd, isDir)
}

// checkEntry refuses entry types this unpacker does not apply and owners
// outside the kernel's range.
func checkEntry(hdr *tar.Header) error {
	switch hdr.Typeflag {
	case tar.TypeXGlobalHeader, tar.TypeReg, tar.TypeDir, tar.TypeSymlink, tar.TypeLink, tar.TypeChar, tar.TypeBlock,
		tar.TypeFifo, '\x00': // '\x00': an old-style regular file (TypeRegA)
	default:
		return fmt.Errorf("unsupported tar entry type %q", hdr.Typeflag)
	}
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	if hdr.Uid < 0 || hdr.Gid < 0 || hdr.Uid >= 1<<32-1 || hdr.Gid >= 1<<32-1 {
		return fmt.Errorf("invalid owner %d:%d", hdr.Uid, hdr.Gid)
	}
	return nil
}

// timespec converts any time a tar header can hold (seconds may be far
// outside the nanosecond range; the kernel clamps to what the fs stores).
func timespec(t time.Time) unix.Timespec {
	return unix.Timespec{Sec: t.Unix(), Nsec: int64(t.Nanosecond())}
}

func atime(hdr *tar.Header) time.Time {
	if hdr.AccessTime.IsZero() {
		return hdr.ModTime
	}
	return hdr.AccessTime
}

// fdMeta sets ownership, then mode (chown clears setuid bits), then xattrs
// (chown clears security.capability) on an open file or directory.
func fdMeta(fd int, hdr *tar.Header, perm uint32) error {
	if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if err := unix.Fchmod(fd, perm); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	for name, val := range xattrs(hdr) {
		if err := unix.Fsetxattr(fd, name, []byte(val), 0); err != nil {
			return fmt.Errorf("set xattr %q: %w", name, err)
		}
	}
	return nil
}

// pathXattrs sets xattrs on a symlink or special file through its parent
// directory's descriptor (the final component is not followed).
func pathXattrs(dirfd int, base string, hdr *tar.Header) error {
	for name, val := range xattrs(hdr) {
		p := "/proc/self/fd/" + strconv.Itoa(dirfd) + "/" + base
		if err := unix.Lsetxattr(p, name, []byte(val), 0); err != nil {
			return fmt.Errorf("set xattr %q: %w", name, err)
		}
	}
	return nil
}

func xattrs(hdr *tar.Header) map[string]string {
	var m map[string]string
	for k, v := range hdr.PAXRecords {
		if name, ok := strings.CutPrefix(k, xattrPrefix); ok && name != "" {
			if m == nil {
				m = map[string]string{}
			}
			m[name] = v
		}
	}
	return m
}

// rootDir applies a "./" entry's metadata to the root directory itself.
func (l *layer) rootDir(hdr *tar.Header) error {
	fd, err := unix.Openat(l.r.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open root: %w", err)
	}
	defer unix.Close(fd)
	if err := fdMeta(fd, hdr, uint32(hdr.Mode)&0o7777); err != nil {
		return err
	}
	l.dirs = append(l.dirs, dirTime{rel: ".", atime: atime(hdr), mtime: hdr.ModTime})
	return nil
}

func (l *layer) setTimes(rel string, at, mt time.Time) error {
	ts := []unix.Timespec{timespec(at), timespec(mt)}
	if rel == "." {
		return unix.UtimesNanoAt(l.r.fd, ".", ts, 0)
	}
	dir, base := split(rel)
	dirfd, err := l.r.openDir(dir, false, nil)
	if err != nil {
		return err
	}
	defer unix.Close(dirfd)
	return unix.UtimesNanoAt(dirfd, base, ts, unix.AT_SYMLINK_NOFOLLOW)
}
