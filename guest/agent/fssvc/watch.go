package fssvc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/fsnotify/fsnotify"

	fspb "github.com/agentenv/agentenv/guest/agent/gen/filesystem"
	"github.com/agentenv/agentenv/guest/agent/users"
)

// maxPolledEvents bounds the queue of a polled watcher nobody drains; the
// oldest events are dropped first.
const maxPolledEvents = 10000

// networkFS lists statfs magic numbers of network filesystems, which a
// watch refuses unless asked (inotify does not see remote changes).
var networkFS = map[int64]string{
	0x6969:     "nfs",
	0xFF534D42: "cifs",
	0xFE534D42: "smb2",
	0x517B:     "smb",
	0x65735546: "fuse",
	0x564c:     "ncp",
}

// dirWatch watches a directory (and, when recursive, its subdirectories,
// including those created later) and turns fsnotify events into protocol
// events named relative to the watched root.
type dirWatch struct {
	root      string
	recursive bool
	withEntry bool
	db        *users.DB
	w         *fsnotify.Watcher
}

func newDirWatch(db *users.DB, root string, recursive, withEntry, allowNetwork bool) (*dirWatch, error) {
	fi, err := os.Stat(root)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%s: %w", root, syscall.ENOTDIR)
	}
	if !allowNetwork {
		var st syscall.Statfs_t
		if err := syscall.Statfs(root, &st); err == nil {
			if name, ok := networkFS[int64(st.Type)]; ok {
				return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("watch %s: on a %s mount; set allow_network_mounts", root, name))
			}
		}
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("create watcher: %w", err)
	}
	dw := &dirWatch{root: root, recursive: recursive, withEntry: withEntry, db: db, w: w}
	if err := dw.add(root); err != nil {
		w.Close()
		return nil, err
	}
	return dw, nil
}

// add watches dir, and its subdirectories when recursive.
func (dw *dirWatch) add(dir string) error {
	if !dw.recursive {
		return dw.w.Add(dir)
	}
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == dir {
				return err
			}
			return nil // vanished or unreadable subtree: skip it
		}
		if d.IsDir() {
			if err := dw.w.Add(p); err != nil && p == dir {
				return err
			}
		}
		return nil
	})
}

// run delivers events until ctx ends or the watcher fails.
func (dw *dirWatch) run(ctx context.Context, emit func(*fspb.FilesystemEvent)) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-dw.w.Events:
			if !ok {
				return nil
			}
			dw.handle(ev, emit)
		case err, ok := <-dw.w.Errors:
			if !ok {
				return nil
			}
			return fmt.Errorf("watch %s: %w", dw.root, err)
		}
	}
}

func (dw *dirWatch) handle(ev fsnotify.Event, emit func(*fspb.FilesystemEvent)) {
	if dw.recursive && ev.Has(fsnotify.Create) {
		if fi, err := os.Lstat(ev.Name); err == nil && fi.IsDir() {
			_ = dw.add(ev.Name)
		}
	}
	rel, err := filepath.Rel(dw.root, ev.Name)
	if err != nil {
		rel = ev.Name
	}
	for _, m := range []struct {
		op fsnotify.Op
		t  fspb.EventType
	}{
		{fsnotify.Create, fspb.EventType_EVENT_TYPE_CREATE},
		{fsnotify.Write, fspb.EventType_EVENT_TYPE_WRITE},
		{fsnotify.Remove, fspb.EventType_EVENT_TYPE_REMOVE},
		{fsnotify.Rename, fspb.EventType_EVENT_TYPE_RENAME},
		{fsnotify.Chmod, fspb.EventType_EVENT_TYPE_CHMOD},
	} {
		if !ev.Has(m.op) {
			continue
		}
		fe := &fspb.FilesystemEvent{Name: rel, Type: m.t}
		if dw.withEntry && m.t != fspb.EventType_EVENT_TYPE_REMOVE && m.t != fspb.EventType_EVENT_TYPE_RENAME {
			if e, err := entryInfo(dw.db, ev.Name); err == nil {
				fe.Entry = e
			}
		}
		emit(fe)
	}
}

func (dw *dirWatch) close() { dw.w.Close() }

// WatchDir streams the events of a directory: a start event once the watch
// is in place, then filesystem events, with keepalives in between.
func (s *Service) WatchDir(ctx context.Context, req *connect.Request[fspb.WatchDirRequest], stream *connect.ServerStream[fspb.WatchDirResponse]) error {
	_, path, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return err
	}
	dw, err := newDirWatch(s.st.Users, path, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry(), req.Msg.GetAllowNetworkMounts())
	if err != nil {
		return rpcError("watch dir", path, err)
	}
	defer dw.close()
	if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Start{Start: &fspb.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := make(chan *fspb.FilesystemEvent, 256)
	errc := make(chan error, 1)
	go func() {
		errc <- dw.run(ctx, func(e *fspb.FilesystemEvent) {
			select {
			case events <- e:
			case <-ctx.Done():
			}
		})
	}()

	var tick <-chan time.Time
	if ka := keepalive(req.Header().Get("Keepalive-Ping-Interval")); ka > 0 {
		t := time.NewTicker(ka)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case e := <-events:
			if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Filesystem{Filesystem: e}}); err != nil {
				return err
			}
		case <-tick:
			if err := stream.Send(&fspb.WatchDirResponse{Event: &fspb.WatchDirResponse_Keepalive{Keepalive: &fspb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case err := <-errc:
			if err != nil {
				return connect.NewError(connect.CodeInternal, err)
			}
			return ctx.Err()
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func keepalive(v string) time.Duration {
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		return 0
	}
	return time.Duration(n) * time.Second
}

// pollWatcher is a watch whose events wait in a queue for GetWatcherEvents.
type pollWatcher struct {
	dw     *dirWatch
	cancel context.CancelFunc

	mu     sync.Mutex
	events []*fspb.FilesystemEvent
	err    error
}

// CreateWatcher starts a polled watch and returns its id.
func (s *Service) CreateWatcher(ctx context.Context, req *connect.Request[fspb.CreateWatcherRequest]) (*connect.Response[fspb.CreateWatcherResponse], error) {
	_, path, err := s.resolve(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	dw, err := newDirWatch(s.st.Users, path, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry(), req.Msg.GetAllowNetworkMounts())
	if err != nil {
		return nil, rpcError("create watcher", path, err)
	}
	id := newID()
	wctx, cancel := context.WithCancel(context.Background())
	pw := &pollWatcher{dw: dw, cancel: cancel}
	go func() {
		err := dw.run(wctx, pw.push)
		pw.mu.Lock()
		pw.err = err
		pw.mu.Unlock()
	}()
	s.mu.Lock()
	s.watchers[id] = pw
	s.mu.Unlock()
	return connect.NewResponse(&fspb.CreateWatcherResponse{WatcherId: id}), nil
}

func (pw *pollWatcher) push(e *fspb.FilesystemEvent) {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	if len(pw.events) >= maxPolledEvents {
		pw.events = pw.events[1:]
	}
	pw.events = append(pw.events, e)
}

// GetWatcherEvents returns and clears the queued events of a watcher.
func (s *Service) GetWatcherEvents(ctx context.Context, req *connect.Request[fspb.GetWatcherEventsRequest]) (*connect.Response[fspb.GetWatcherEventsResponse], error) {
	pw, err := s.watcher(req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	pw.mu.Lock()
	events, werr := pw.events, pw.err
	pw.events = nil
	pw.mu.Unlock()
	if werr != nil && len(events) == 0 {
		return nil, connect.NewError(connect.CodeInternal, werr)
	}
	return connect.NewResponse(&fspb.GetWatcherEventsResponse{Events: events}), nil
}

// RemoveWatcher stops a watcher.
func (s *Service) RemoveWatcher(ctx context.Context, req *connect.Request[fspb.RemoveWatcherRequest]) (*connect.Response[fspb.RemoveWatcherResponse], error) {
	id := req.Msg.GetWatcherId()
	s.mu.Lock()
	pw, ok := s.watchers[id]
	delete(s.watchers, id)
	s.mu.Unlock()
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found", id))
	}
	pw.cancel()
	pw.dw.close()
	return connect.NewResponse(&fspb.RemoveWatcherResponse{}), nil
}

func (s *Service) watcher(id string) (*pollWatcher, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	pw, ok := s.watchers[id]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found", id))
	}
	return pw, nil
}

func newID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
