package unpack

import (
	"fmt"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"
)

// whiteout handles ".wh.<name>" and ".wh..wh..opq" in directory dir.
func (l *layer) whiteout(dir, base string) error {
	if base == opaqueMarker {
		dirfd, err := l.r.openDir(dir, true, func(p string) { l.seen[p] = true })
		if err != nil {
			return fmt.Errorf("opaque directory %q: %w", dir, err)
		}
		defer unix.Close(dirfd)
		l.seen[dir] = true
		l.markParents(dir)
		return l.prune(dir, dirfd)
	}
	name := strings.TrimPrefix(base, whiteoutPrefix)
	if strings.HasPrefix(name, whiteoutPrefix) {
		return nil // other AUFS metadata (.wh..wh.plnk, ...): nothing to do
	}
	if name == "" || name == "." || name == ".." {
		return fmt.Errorf("%w: invalid whiteout name %q", ErrUnsafePath, base)
	}
	target := path.Join(dir, name)
	if l.seen[target] {
		return nil // whiteouts hide lower layers only, not this layer's entries
	}
	dirfd, err := l.r.openDir(dir, false, nil)
	if err == unix.ENOENT || err == unix.ENOTDIR {
		return nil // nothing below to hide
	}
	if err != nil {
		return fmt.Errorf("whiteout parent %q: %w", dir, err)
	}
	defer unix.Close(dirfd)
	if err := removeAll(dirfd, name); err != nil {
		return fmt.Errorf("whiteout %q: %w", target, err)
	}
	return nil
}

// prune removes everything below dir that this layer did not write.
func (l *layer) prune(dir string, dirfd int) error {
	fd, err := unix.Openat(dirfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opaque directory %q: %w", dir, err)
	}
	f := os.NewFile(uintptr(fd), dir)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("opaque directory %q: list: %w", dir, err)
	}
	for _, n := range names {
		p := path.Join(dir, n)
		if !l.seen[p] {
			if err := removeAll(fd, n); err != nil {
				return fmt.Errorf("opaque directory %q: remove %q: %w", dir, n, err)
			}
			continue
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			sub, err := unix.Openat(fd, n, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("opaque directory %q: %w", p, err)
			}
			err = l.prune(p, sub)
			unix.Close(sub)
			if err != nil {
				return err
			}
		}
	}
	return nil
}
