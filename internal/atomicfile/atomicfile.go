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
func Write(path string, perm os.FileMode, fill func(w io.Writer) error) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return fmt.Errorf("atomic write %s: %w", path, err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	if err := f.Chmod(perm); err != nil {
		return fmt.Errorf("atomic write %s: %w", path, err)
	}
	if err := fill(f); err != nil {
		return fmt.Errorf("atomic write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("atomic write %s: sync: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("atomic write %s: close: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("atomic write %s: %w", path, err)
	}
	if err := SyncDir(dir); err != nil {
		return fmt.Errorf("atomic write %s: %w", path, err)
	}
	return nil
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
