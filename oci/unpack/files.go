package unpack

import (
	"fmt"
	"io"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// MaxReadFile bounds what ReadFile reads (an image's /etc/passwd is small;
// a huge or sparse one must not be read into memory).
const MaxReadFile = 16 << 20

// openRegular opens rel (resolved inside the root) for reading only if it is
// a regular file. The path is first opened O_PATH, which never opens the
// file itself: a FIFO would block the open until a writer comes, and a
// device node would have root open a host device. Only once fstat says
// "regular" is that same inode reopened for reading, through its descriptor.
func (r *Root) openRegular(rel string) (*os.File, unix.Stat_t, error) {
	var st unix.Stat_t
	clean, err := Clean(rel)
	if err != nil {
		return nil, st, err
	}
	pfd, err := r.openat2(clean, unix.O_PATH)
	if err != nil {
		return nil, st, &os.PathError{Op: "open", Path: rel, Err: err}
	}
	defer unix.Close(pfd)
	if err := unix.Fstat(pfd, &st); err != nil {
		return nil, st, &os.PathError{Op: "stat", Path: rel, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, st, fmt.Errorf("%s: not a regular file (mode %#o)", rel, st.Mode&unix.S_IFMT)
	}
	fd, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pfd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, st, &os.PathError{Op: "reopen", Path: rel, Err: err}
	}
	var again unix.Stat_t
	if err := unix.Fstat(fd, &again); err != nil || again.Ino != st.Ino || again.Dev != st.Dev {
		unix.Close(fd)
		return nil, st, fmt.Errorf("%s: changed while opened", rel)
	}
	return os.NewFile(uintptr(fd), rel), st, nil
}

// ReadFile reads the regular file rel (resolved inside the root) of at most
// MaxReadFile bytes; anything else (FIFO, device, socket, directory) is an
// error and is never opened.
func (r *Root) ReadFile(rel string) ([]byte, error) {
	f, st, err := r.openRegular(rel)
	if err != nil {
		return nil, fmt.Errorf("unpack: read %q: %w", rel, err)
	}
	defer f.Close()
	if st.Size > MaxReadFile {
		return nil, fmt.Errorf("unpack: read %q: %d bytes, larger than %d", rel, st.Size, MaxReadFile)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxReadFile+1))
	if err == nil && len(b) > MaxReadFile {
		err = fmt.Errorf("larger than %d bytes", MaxReadFile)
	}
	if err != nil {
		return nil, fmt.Errorf("unpack: read %q: %w", rel, err)
	}
	return b, nil
}

// IsRegular reports whether rel (resolved inside the root) is a regular
// file, without opening it.
func (r *Root) IsRegular(rel string) bool {
	clean, err := Clean(rel)
	if err != nil {
		return false
	}
	fd, err := r.openat2(clean, unix.O_PATH)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	return unix.Fstat(fd, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG
}

// MkdirAll makes directory rel and its missing parents inside the root; the
// directories it creates get perm and uid:gid (parents 0755 root-owned).
func (r *Root) MkdirAll(rel string, perm uint32, uid, gid int) error {
	clean, err := Clean(rel)
	if err != nil {
		return fmt.Errorf("unpack: mkdir %q: %w", rel, err)
	}
	if clean == "." {
		return nil
	}
	made := false
	fd, err := r.openDir(clean, true, func(p string) { made = made || p == clean })
	if err != nil {
		return fmt.Errorf("unpack: mkdir %q: %w", rel, err)
	}
	defer unix.Close(fd)
	if !made {
		return nil
	}
	dir, base := split(clean)
	dirfd, err := r.openDir(dir, false, nil)
	if err != nil {
		return fmt.Errorf("unpack: mkdir %q: %w", rel, err)
	}
	defer unix.Close(dirfd)
	if err := unix.Fchownat(dirfd, base, uid, gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("unpack: chown %q: %w", rel, err)
	}
	if err := unix.Fchmodat(dirfd, base, perm, 0); err != nil {
		return fmt.Errorf("unpack: chmod %q: %w", rel, err)
	}
	return nil
}

// WriteFile replaces rel (whatever it was, symbolic links included: the link
// itself is replaced, never followed) with a regular file holding data, owned
// by uid:gid with mode perm. Missing parents are created.
func (r *Root) WriteFile(rel string, data []byte, perm uint32, uid, gid int) error {
	clean, err := Clean(rel)
	if err != nil {
		return fmt.Errorf("unpack: write %q: %w", rel, err)
	}
	if clean == "." {
		return fmt.Errorf("unpack: write %q: is the root", rel)
	}
	dir, base := split(clean)
	dirfd, err := r.openDir(dir, true, nil)
	if err != nil {
		return fmt.Errorf("unpack: write %q: parent: %w", rel, err)
	}
	defer unix.Close(dirfd)
	if err := removeAll(dirfd, base); err != nil {
		return fmt.Errorf("unpack: write %q: replace: %w", rel, err)
	}
	fd, err := unix.Openat(dirfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("unpack: write %q: create: %w", rel, err)
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	if _, err := f.Write(data); err != nil {
		return fmt.Errorf("unpack: write %q: %w", rel, err)
	}
	if err := unix.Fchown(fd, uid, gid); err != nil {
		return fmt.Errorf("unpack: write %q: chown: %w", rel, err)
	}
	if err := unix.Fchmod(fd, perm); err != nil {
		return fmt.Errorf("unpack: write %q: chmod: %w", rel, err)
	}
	return nil
}

// CopyFile writes the host file src into the root at rel (see WriteFile).
func (r *Root) CopyFile(rel, src string, perm uint32, uid, gid int) error {
	b, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("unpack: copy %s: %w", src, err)
	}
	return r.WriteFile(rel, b, perm, uid, gid)
}
