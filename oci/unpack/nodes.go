package unpack

import (
	"archive/tar"
	"fmt"
	"io"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// create makes the node of hdr as base in dirfd (nothing is there, or the
// directory it replaces in place: isDir), with its metadata and times.
func (l *layer) create(dirfd int, base, rel string, hdr *tar.Header, rd io.Reader, isDir bool) error {
	perm := uint32(hdr.Mode) & 0o7777
	var err error
	switch hdr.Typeflag {
	case tar.TypeDir:
		return l.makeDir(dirfd, base, rel, hdr, perm, isDir) // times at the end of the layer
	case tar.TypeLink:
		return l.makeHardLink(dirfd, base, hdr) // shares the target's inode and metadata
	case tar.TypeReg, '\x00':
		err = l.makeFile(dirfd, base, hdr, rd, perm)
	case tar.TypeSymlink:
		err = l.makeSymlink(dirfd, base, hdr)
	default: // a character or block device or a FIFO (checkEntry allowed no other)
		err = l.makeSpecial(dirfd, base, hdr, perm)
	}
	if err != nil {
		return err
	}
	ts := []unix.Timespec{timespec(atime(hdr)), timespec(hdr.ModTime)}
	if err := unix.UtimesNanoAt(dirfd, base, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times: %w", err)
	}
	return nil
}

// makeDir creates a directory (or keeps the one there) and sets its
// metadata; its times are set once the layer is done (files made in it
// later would change them).
func (l *layer) makeDir(dirfd int, base, rel string, hdr *tar.Header, perm uint32, isDir bool) error {
	if !isDir {
		if err := l.r.newInode(); err != nil {
			return err
		}
		if err := unix.Mkdirat(dirfd, base, 0o700); err != nil {
			return fmt.Errorf("mkdir: %w", err)
		}
	}
	fd, err := unix.Openat(dirfd, base, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open directory: %w", err)
	}
	defer unix.Close(fd)
	if err := fdMeta(fd, hdr, perm); err != nil {
		return err
	}
	l.dirs = append(l.dirs, dirTime{rel: rel, atime: atime(hdr), mtime: hdr.ModTime})
	return nil
}

// makeFile writes a regular file's bytes, charged against the unpack's
// size limit, and sets its metadata.
func (l *layer) makeFile(dirfd int, base string, hdr *tar.Header, rd io.Reader, perm uint32) error {
	if err := l.r.newInode(); err != nil {
		return err
	}
	if err := l.r.charge(hdr.Size, "file"); err != nil {
		return err
	}
	fd, err := unix.Openat(dirfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create file: %w", err)
	}
	f := os.NewFile(uintptr(fd), base)
	defer f.Close()
	n, err := io.Copy(f, rd)
	l.stats.Bytes += n
	if err != nil {
		return fmt.Errorf("write file: %w", err)
	}
	return fdMeta(fd, hdr, perm)
}

func (l *layer) makeSymlink(dirfd int, base string, hdr *tar.Header) error {
	if hdr.Linkname == "" || strings.IndexByte(hdr.Linkname, 0) >= 0 {
		return fmt.Errorf("invalid symlink target %q", hdr.Linkname)
	}
	if err := l.r.newInode(); err != nil {
		return err
	}
	if err := unix.Symlinkat(hdr.Linkname, dirfd, base); err != nil {
		return fmt.Errorf("symlink: %w", err)
	}
	if err := unix.Fchownat(dirfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown symlink: %w", err)
	}
	return pathXattrs(dirfd, base, hdr)
}

// makeHardLink links base to a path already unpacked (resolved inside the
// root like any other path).
func (l *layer) makeHardLink(dirfd int, base string, hdr *tar.Header) error {
	target, err := Clean(hdr.Linkname)
	if err != nil {
		return fmt.Errorf("hard link target: %w", err)
	}
	if target == "." {
		return fmt.Errorf("hard link to the root directory")
	}
	tdir, tbase := split(target)
	tfd, err := l.r.openDir(tdir, false, nil)
	if err != nil {
		return fmt.Errorf("hard link target %q: %w", hdr.Linkname, err)
	}
	err = unix.Linkat(tfd, tbase, dirfd, base, 0)
	unix.Close(tfd)
	if err != nil {
		return fmt.Errorf("hard link to %q: %w", hdr.Linkname, err)
	}
	return nil
}

// makeSpecial makes a character or block device node or a FIFO.
func (l *layer) makeSpecial(dirfd int, base string, hdr *tar.Header, perm uint32) error {
	mode := uint32(unix.S_IFIFO)
	switch hdr.Typeflag {
	case tar.TypeChar:
		mode = unix.S_IFCHR
	case tar.TypeBlock:
		mode = unix.S_IFBLK
	}
	if hdr.Devmajor < 0 || hdr.Devminor < 0 || hdr.Devmajor > 0xffffffff || hdr.Devminor > 0xffffffff {
		return fmt.Errorf("invalid device number %d:%d", hdr.Devmajor, hdr.Devminor)
	}
	dev := unix.Mkdev(uint32(hdr.Devmajor), uint32(hdr.Devminor))
	if err := l.r.newInode(); err != nil {
		return err
	}
	if err := unix.Mknodat(dirfd, base, mode|0o600, int(dev)); err != nil {
		return fmt.Errorf("mknod: %w", err)
	}
	// A special file opened O_PATH: fchown/fchmod through /proc would be
	// needed; the *at calls below act on the node just made (never a symlink).
	if err := unix.Fchownat(dirfd, base, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if err := unix.Fchmodat(dirfd, base, perm, 0); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	return pathXattrs(dirfd, base, hdr)
}
