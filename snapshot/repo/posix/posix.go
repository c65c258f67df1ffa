// Package posix is the snapshot repository's backend in a local directory
// (the default: one node, or several sharing a file system). An object is a
// file under the directory, its key the relative path; every put goes through
// internal/atomicfile, so a file under its final name is always complete and
// durable.
package posix

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/snapshot/repo"
)

// Backend stores objects as files under a directory.
type Backend struct{ dir string }

// Open opens (creating it when missing) the repository in dir.
func Open(dir string, opt repo.Options) (*repo.Repo, error) {
	b, err := NewBackend(dir)
	if err != nil {
		return nil, err
	}
	return repo.New(b, opt), nil
}

// NewBackend returns the backend in dir, creating dir when missing.
func NewBackend(dir string) (*Backend, error) {
	if dir == "" {
		return nil, fmt.Errorf("open repository: empty directory")
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("open repository %s: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("open repository %s: %w", dir, err)
	}
	return &Backend{dir: abs}, nil
}

func (b *Backend) String() string { return "file://" + b.dir }

// path maps a key to its file; keys are the repository's own, but a key
// that would leave the directory is refused all the same.
func (b *Backend) path(key string) (string, error) {
	clean := filepath.Clean("/" + key)
	if key == "" || clean != "/"+key || strings.Contains(key, "\\") {
		return "", fmt.Errorf("object key %q: %w", key, repo.ErrInvalid)
	}
	for _, part := range strings.Split(key, "/") {
		if atomicfile.IsTemp(part) {
			return "", fmt.Errorf("object key %q: %w (temporary name)", key, repo.ErrInvalid)
		}
	}
	return filepath.Join(b.dir, filepath.FromSlash(key)), nil
}

// Put implements repo.Backend.
func (b *Backend) Put(ctx context.Context, key string, r io.Reader, size int64, check func() error) error {
	p, err := b.path(key)
	if err != nil {
		return err
	}
	if err := b.mkdirs(filepath.Dir(p)); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	f, err := atomicfile.Create(p, 0o600)
	if err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	n, err := io.Copy(f, ctxReader{ctx, r})
	if err == nil && n != size {
		err = fmt.Errorf("source gave %d of %d bytes", n, size)
	}
	if err == nil && check != nil {
		err = check()
	}
	if err != nil {
		f.Abort()
		return fmt.Errorf("put %s: %w", key, err)
	}
	if err := f.Commit(); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	return nil
}

// mkdirs creates dir and any missing parents durably: each new directory's
// entry is synced in its parent, so a blob renamed into it survives a power
// loss with its path.
func (b *Backend) mkdirs(dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	if dir == b.dir || dir == filepath.Dir(dir) {
		return os.MkdirAll(dir, 0o700)
	}
	if err := b.mkdirs(filepath.Dir(dir)); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return atomicfile.SyncDir(filepath.Dir(dir))
}

// ctxReader stops a long copy when ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// Get implements repo.Backend.
func (b *Backend) Get(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	p, err := b.path(key)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("get %s: %w", key, repo.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("get %s: %w", key, err)
	}
	if off > st.Size() {
		f.Close()
		return nil, fmt.Errorf("get %s: offset %d past its %d bytes: %w", key, off, st.Size(), repo.ErrInvalid)
	}
	if n < 0 || off+n > st.Size() {
		n = st.Size() - off
	}
	return readCloser{io.NewSectionReader(f, off, n), f}, nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

// Stat implements repo.Backend.
func (b *Backend) Stat(ctx context.Context, key string) (repo.ObjectInfo, error) {
	p, err := b.path(key)
	if err != nil {
		return repo.ObjectInfo{}, err
	}
	st, err := os.Stat(p)
	if errors.Is(err, fs.ErrNotExist) {
		return repo.ObjectInfo{}, fmt.Errorf("stat %s: %w", key, repo.ErrNotFound)
	}
	if err != nil {
		return repo.ObjectInfo{}, fmt.Errorf("stat %s: %w", key, err)
	}
	return repo.ObjectInfo{Key: key, Size: st.Size(), ModTime: st.ModTime()}, nil
}

// List implements repo.Backend.
func (b *Backend) List(ctx context.Context, prefix string) ([]repo.ObjectInfo, error) {
	root := filepath.Join(b.dir, filepath.FromSlash(prefix))
	var out []repo.ObjectInfo
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) && p == root {
			return fs.SkipAll
		}
		if err != nil || d.IsDir() || atomicfile.IsTemp(d.Name()) || !d.Type().IsRegular() {
			return err
		}
		info, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil // removed meanwhile
		}
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(b.dir, p)
		if err != nil {
			return err
		}
		out = append(out, repo.ObjectInfo{Key: filepath.ToSlash(rel), Size: info.Size(), ModTime: info.ModTime()})
		return ctx.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", prefix, err)
	}
	return out, nil
}

// Delete implements repo.Backend.
func (b *Backend) Delete(ctx context.Context, key string) error {
	p, err := b.path(key)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete %s: %w", key, err)
	}
	return atomicfile.SyncDir(filepath.Dir(p))
}

// CleanStale removes temporary files of puts a crash interrupted that are
// older than before (repo.StaleCleaner).
func (b *Backend) CleanStale(ctx context.Context, before time.Time) (int, error) {
	n := 0
	err := filepath.WalkDir(b.dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !atomicfile.IsTemp(d.Name()) {
			return err
		}
		info, err := d.Info()
		if err != nil || !info.ModTime().Before(before) {
			return nil
		}
		if os.Remove(p) == nil {
			n++
		}
		return ctx.Err()
	})
	if err != nil {
		return n, fmt.Errorf("clean stale temporary files in %s: %w", b.dir, err)
	}
	return n, nil
}
