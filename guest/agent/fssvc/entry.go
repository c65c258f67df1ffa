package fssvc

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/timestamppb"

	fspb "github.com/agentenv/agentenv/guest/agent/gen/filesystem"
	"github.com/agentenv/agentenv/guest/agent/users"
)

// MetadataXattrPrefix names the extended attributes that hold a file's user
// metadata (the X-Metadata-* headers of an upload), E2B's namespace.
const MetadataXattrPrefix = "user.e2b."

// entryInfo describes path without following a final symlink.
func entryInfo(db *users.DB, path string) (*fspb.EntryInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	return infoFrom(db, path, fi), nil
}

func infoFrom(db *users.DB, path string, fi fs.FileInfo) *fspb.EntryInfo {
	e := &fspb.EntryInfo{
		Name:         fi.Name(),
		Path:         path,
		Size:         fi.Size(),
		Mode:         uint32(fi.Mode().Perm()),
		Permissions:  fi.Mode().String(),
		ModifiedTime: timestamppb.New(fi.ModTime()),
		Type:         fileType(fi.Mode()),
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner = db.UserName(st.Uid)
		e.Group = db.GroupName(st.Gid)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		if target, err := os.Readlink(path); err == nil {
			if !filepath.IsAbs(target) {
				target = filepath.Join(filepath.Dir(path), target)
			}
			e.SymlinkTarget = &target
		}
	}
	if fi.Mode().IsRegular() {
		e.Metadata = ReadMetadata(path)
	}
	return e
}

func fileType(m fs.FileMode) fspb.FileType {
	switch {
	case m&fs.ModeSymlink != 0:
		return fspb.FileType_FILE_TYPE_SYMLINK
	case m.IsDir():
		return fspb.FileType_FILE_TYPE_DIRECTORY
	default:
		return fspb.FileType_FILE_TYPE_FILE
	}
}

// ReadMetadata returns the user metadata stored in path's extended
// attributes (also ones set out-of-band), nil when there is none or the
// filesystem has no xattrs.
func ReadMetadata(path string) map[string]string {
	names, err := metadataXattrs(path)
	if err != nil {
		return nil
	}
	var out map[string]string
	for _, name := range names {
		val, err := getXattr(path, name)
		if err != nil {
			continue // removed meanwhile
		}
		if out == nil {
			out = map[string]string{}
		}
		out[strings.TrimPrefix(name, MetadataXattrPrefix)] = string(val)
	}
	return out
}

// ReplaceMetadata makes md the whole of path's user metadata: keys path has
// and md lacks are removed (an empty md clears it all), as an upload in
// E2B's agent does. On a filesystem without xattrs it fails with ENOTSUP
// (syscall.ENOTSUP).
func ReplaceMetadata(path string, md map[string]string) error {
	names, err := metadataXattrs(path)
	if err != nil {
		return fmt.Errorf("list metadata of %s: %w", path, err)
	}
	for _, name := range names {
		if _, keep := md[strings.TrimPrefix(name, MetadataXattrPrefix)]; keep {
			continue
		}
		if err := syscall.Removexattr(path, name); err != nil && !errors.Is(err, syscall.ENODATA) {
			return fmt.Errorf("remove metadata %q of %s: %w", name, path, err)
		}
	}
	for k, v := range md {
		if err := syscall.Setxattr(path, MetadataXattrPrefix+k, []byte(v), 0); err != nil {
			return fmt.Errorf("set metadata %q on %s: %w", k, path, err)
		}
	}
	return nil
}

// metadataXattrs lists path's extended attributes in the metadata namespace.
func metadataXattrs(path string) ([]string, error) {
	buf, err := sizedRead(func(b []byte) (int, error) { return syscall.Listxattr(path, b) })
	if err != nil {
		return nil, err
	}
	var out []string
	for _, name := range strings.Split(string(buf), "\x00") {
		if key, ok := strings.CutPrefix(name, MetadataXattrPrefix); ok && key != "" {
			out = append(out, name)
		}
	}
	return out, nil
}

func getXattr(path, name string) ([]byte, error) {
	return sizedRead(func(b []byte) (int, error) { return syscall.Getxattr(path, name, b) })
}

// sizedRead calls an xattr read first for its size, then with a buffer of
// that size, again when the attribute grew in between (ERANGE).
func sizedRead(read func([]byte) (int, error)) ([]byte, error) {
	for range 4 {
		n, err := read(nil)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, nil
		}
		buf := make([]byte, n)
		n, err = read(buf)
		if errors.Is(err, syscall.ERANGE) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
	return nil, syscall.ERANGE
}

// Code maps a filesystem error to the Connect code E2B's SDKs branch on.
func Code(err error) connect.Code {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return connect.CodeNotFound
	case errors.Is(err, fs.ErrExist):
		return connect.CodeAlreadyExists
	case errors.Is(err, fs.ErrPermission):
		return connect.CodePermissionDenied
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.ENOTEMPTY):
		return connect.CodeInvalidArgument
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return connect.CodeResourceExhausted
	default:
		return connect.CodeInternal
	}
}

// rpcError wraps err with the operation and its Connect code.
func rpcError(op, path string, err error) error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return err
	}
	return connect.NewError(Code(err), fmt.Errorf("%s %s: %w", op, path, err))
}
