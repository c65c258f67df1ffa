// Package atomicfile is the one way AgentENV writes a file that a record
// points to: the bytes go to a temporary file in the same directory, which is
// fsynced, renamed over the final name, and then the directory is fsynced.
// After a crash or a power loss the final name holds either the old file or
// the complete new one, never a prefix, and once Write returns the new file
// survives a power loss.
//
// The durability rules of the node build on this: a record is written only
// after every file it names was written through this package (or fsynced and
// its directory synced with SyncDir), so a record never points at a file that
// is not complete on disk.
package atomicfile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// WriteFile atomically replaces path with data (perm applies to a new file).
func WriteFile(path string, data []byte, perm os.FileMode) error {
	return Write(path, perm, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// Write atomically replaces path with what fill writes. fill's error, or any
// error of the write-out, leaves path untouched and removes the temporary file.
func Write(path string, perm os.FileMode, fill func(w io.Writer) error) error {
	f, err := Create(path, perm)
	if err != nil {
		return err
	}
	if err := fill(f); err != nil {
		f.Abort()
		return fmt.Errorf("atomic write %s: %w", path, err)
	}
	return f.Commit()
}

// CopyFile atomically replaces dst with a copy of src.
func CopyFile(dst, src string, perm os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("atomic copy %s: %w", src, err)
	}
	defer in.Close()
	return Write(dst, perm, func(w io.Writer) error {
		_, err := io.Copy(w, in)
		return err
	})
}

// Rename renames oldpath to newpath and fsyncs the directories of both, so
// the rename survives a power loss. The file itself must already be synced.
func Rename(oldpath, newpath string) error {
	if err := os.Rename(oldpath, newpath); err != nil {
		return fmt.Errorf("durable rename: %w", err)
	}
	od, nd := filepath.Dir(oldpath), filepath.Dir(newpath)
	err := SyncDir(nd)
	if od != nd {
		err = errors.Join(err, SyncDir(od))
	}
	if err != nil {
		return fmt.Errorf("durable rename %s: %w", newpath, err)
	}
	return nil
}

// SyncFile fsyncs a file written in place (e.g. a layer written by a
// streaming writer) and then its directory, making both its bytes and its
// name durable.
func SyncFile(path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	return SyncDir(filepath.Dir(path))
}

// SyncDir fsyncs a directory, making the creation, removal and renaming of
// its entries durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	return nil
}

// SyncTree fsyncs every regular file under dir, then every directory
// bottom up: for output a tool wrote in place (a VMM's snapshot directory)
// before a record names it.
func SyncTree(dir string) error {
	var dirs []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir():
			dirs = append(dirs, path)
			return nil
		case !d.Type().IsRegular():
			return nil
		}
		f, err := os.OpenFile(path, os.O_RDONLY, 0)
		if err != nil {
			return err
		}
		err = f.Sync()
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("sync tree %s: %w", dir, err)
	}
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := SyncDir(dirs[i]); err != nil {
			return err
		}
	}
	return SyncDir(filepath.Dir(filepath.Clean(dir)))
}

// File is an output being written in place under a temporary name, for
// writers that need the file itself (random-access writes, Truncate): Commit
// makes it the final name durably, Abort drops it. Write is the simpler form.
type File struct {
	*os.File
	path string
	done bool
}

// Create starts an atomic replacement of path (perm applies to the new file).
func Create(path string, perm os.FileMode) (*File, error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return nil, fmt.Errorf("atomic write %s: %w", path, err)
	}
	if err := f.Chmod(perm); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, fmt.Errorf("atomic write %s: %w", path, err)
	}
	return &File{File: f, path: path}, nil
}

// Commit fsyncs the file, renames it over the final name and fsyncs the
// directory. On error the temporary file is gone and path is untouched.
func (f *File) Commit() error {
	if f.done {
		return fmt.Errorf("atomic write %s: already finished", f.path)
	}
	f.done = true
	err := f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), f.path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("atomic write %s: %w", f.path, err)
	}
	return SyncDir(filepath.Dir(f.path))
}

// Abort drops the temporary file (a no-op after Commit).
func (f *File) Abort() {
	if f.done {
		return
	}
	f.done = true
	f.Close()
	os.Remove(f.Name())
}

// IsTemp reports whether a directory entry's name is a temporary file of
// this package (an atomic write in progress or one a crash left).
func IsTemp(name string) bool {
	return strings.HasPrefix(name, ".") && strings.Contains(name, ".tmp-")
}
