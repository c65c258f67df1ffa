// Package fssvc implements E2B's filesystem.Filesystem Connect service: stat,
// list (to a depth), make directories, move, remove, and directory watches
// (streamed, or polled through CreateWatcher/GetWatcherEvents). Operations
// run with the agent's privileges; what they create is handed to the
// requesting user, the way a login session would own it.
package fssvc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"connectrpc.com/connect"

	fspb "github.com/agentenv/agentenv/guest/agent/gen/filesystem"
	"github.com/agentenv/agentenv/guest/agent/gen/filesystem/filesystemconnect"
	"github.com/agentenv/agentenv/guest/agent/state"
	"github.com/agentenv/agentenv/guest/agent/users"
)

// Service implements filesystemconnect.FilesystemHandler.
type Service struct {
	st  *state.State
	log *slog.Logger

	mu       sync.Mutex
	watchers map[string]*pollWatcher
}

var _ filesystemconnect.FilesystemHandler = (*Service)(nil)

// New returns the service.
func New(st *state.State, log *slog.Logger) *Service {
	if log == nil {
		log = slog.Default()
	}
	return &Service{st: st, log: log, watchers: map[string]*pollWatcher{}}
}

// resolve returns the request's user and the absolute form of p.
func (s *Service) resolve(h http.Header, p string) (*users.User, string, error) {
	u, err := s.st.RequestUser(h)
	if err != nil {
		if errors.Is(err, users.ErrUnknown) {
			return nil, "", connect.NewError(connect.CodeInvalidArgument, err)
		}
		return nil, "", connect.NewError(connect.CodeUnauthenticated, err)
	}
	abs, err := state.ResolvePath(u, p)
	if err != nil {
		return nil, "", connect.NewError(connect.CodeInvalidArgument, err)
	}
	return u, abs, nil
}

// Stat describes one entry (a final symlink is not followed).
func (s *Service) Stat(ctx context.Context, req *connect.Request[fspb.StatRequest]) (*connect.Response[fspb.StatResponse], error) {
	_, path, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	e, err := entryInfo(s.st.Users, path)
	if err != nil {
		return nil, rpcError("stat", path, err)
	}
	return connect.NewResponse(&fspb.StatResponse{Entry: e}), nil
}

// MakeDir creates a directory and its missing parents; an existing one is already_exists.
func (s *Service) MakeDir(ctx context.Context, req *connect.Request[fspb.MakeDirRequest]) (*connect.Response[fspb.MakeDirResponse], error) {
	u, path, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(path); err == nil {
		if fi.IsDir() {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("make dir %s: directory already exists", path))
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("make dir %s: a file is in the way", path))
	}
	if err := MkdirAllOwned(path, u); err != nil {
		return nil, rpcError("make dir", path, err)
	}
	e, err := entryInfo(s.st.Users, path)
	if err != nil {
		return nil, rpcError("make dir", path, err)
	}
	return connect.NewResponse(&fspb.MakeDirResponse{Entry: e}), nil
}

// Move renames source to destination, creating the destination's parents.
func (s *Service) Move(ctx context.Context, req *connect.Request[fspb.MoveRequest]) (*connect.Response[fspb.MoveResponse], error) {
	u, src, err := s.resolve(req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	_, dst, err := s.resolve(req.Header(), req.Msg.GetDestination())
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(src); err != nil {
		return nil, rpcError("move", src, err)
	}
	if err := MkdirAllOwned(filepath.Dir(dst), u); err != nil {
		return nil, rpcError("move", dst, err)
	}
	if err := os.Rename(src, dst); err != nil {
		return nil, rpcError("move", src, err)
	}
	e, err := entryInfo(s.st.Users, dst)
	if err != nil {
		return nil, rpcError("move", dst, err)
	}
	return connect.NewResponse(&fspb.MoveResponse{Entry: e}), nil
}

// Remove deletes a file or a whole directory tree. Like E2B's agent (a
// remove-all) it succeeds when the path does not exist.
func (s *Service) Remove(ctx context.Context, req *connect.Request[fspb.RemoveRequest]) (*connect.Response[fspb.RemoveResponse], error) {
	_, path, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if err := os.RemoveAll(path); err != nil {
		return nil, rpcError("remove", path, err)
	}
	return connect.NewResponse(&fspb.RemoveResponse{}), nil
}

// ListDir lists a directory's entries down to depth levels (0 means 1).
func (s *Service) ListDir(ctx context.Context, req *connect.Request[fspb.ListDirRequest]) (*connect.Response[fspb.ListDirResponse], error) {
	_, path, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	root, err := dirRoot(path)
	if err != nil {
		return nil, rpcError("list dir", path, err)
	}
	depth := int(req.Msg.GetDepth())
	if depth < 1 {
		depth = 1
	}
	var entries []*fspb.EntryInfo
	err = s.walk(ctx, root, path, depth, func(e *fspb.EntryInfo) { entries = append(entries, e) })
	if err != nil {
		return nil, rpcError("list dir", path, err)
	}
	return connect.NewResponse(&fspb.ListDirResponse{Entries: entries}), nil
}

// dirRoot follows symlinks of the listed directory itself (not of its entries)
// and checks that it is a directory.
func dirRoot(path string) (string, error) {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(real)
	if err != nil {
		return "", err
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("%s: %w", path, syscall.ENOTDIR)
	}
	return real, nil
}

// walk reports the entries under dir down to depth, naming them under
// shown (the path as the client gave it). Symlinked directories are not
// descended into, so loops cannot happen.
func (s *Service) walk(ctx context.Context, dir, shown string, depth int, fn func(*fspb.EntryInfo)) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	des, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, de := range des {
		fi, err := de.Info()
		if err != nil {
			continue // removed meanwhile
		}
		full, shownFull := filepath.Join(dir, de.Name()), filepath.Join(shown, de.Name())
		e := infoFrom(s.st.Users, full, fi)
		e.Path = shownFull
		if e.SymlinkTarget != nil && !filepath.IsAbs(*e.SymlinkTarget) {
			t := filepath.Join(shown, *e.SymlinkTarget)
			e.SymlinkTarget = &t
		}
		fn(e)
		if depth > 1 && fi.IsDir() {
			if err := s.walk(ctx, full, shownFull, depth-1, fn); err != nil && !errors.Is(err, fs.ErrPermission) {
				return err
			}
		}
	}
	return nil
}

// MkdirAllOwned creates path and its missing parents, giving each directory
// it created to u.
func MkdirAllOwned(path string, u *users.User) error {
	var created []string
	for p := path; ; p = filepath.Dir(p) {
		if _, err := os.Lstat(p); err == nil {
			break
		}
		created = append(created, p)
		if p == filepath.Dir(p) {
			break
		}
	}
	if err := os.MkdirAll(path, 0o755); err != nil {
		return err
	}
	for _, p := range created {
		if err := Chown(p, u); err != nil {
			return err
		}
	}
	return nil
}

// Chown gives path to u when the agent may (as root); otherwise it is a no-op
// because what the agent creates already belongs to the agent's user.
func Chown(path string, u *users.User) error {
	if os.Geteuid() != 0 || u == nil {
		return nil
	}
	if err := os.Lchown(path, int(u.UID), int(u.GID)); err != nil {
		return fmt.Errorf("chown %s to %s: %w", path, u.Name, err)
	}
	return nil
}
