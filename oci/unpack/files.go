package unpack

import (
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// ReadFile reads the regular file rel (resolved inside the root).
func (r *Root) ReadFile(rel string) ([]byte, error) {
	clean, err := Clean(rel)
	if err != nil {
		return nil, fmt.Errorf("unpack: read %q: %w", rel, err)
	}
	fd, err := r.openat2(clean, unix.O_RDONLY)
	if err != nil {
		return nil, fmt.Errorf("unpack: read %q: %w", rel, &os.PathError{Op: "open", Path: rel, Err: err})
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("unpack: read %q: %w", rel, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("unpack: read %q: not a regular file", rel)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("unpack: read %q: %w", rel, err)
	}
	return b, nil
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
