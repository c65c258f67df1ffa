package fssvc_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/agentenv/agentenv/guest/agent/agenttest"
	"github.com/agentenv/agentenv/guest/agent/fssvc"
	fspb "github.com/agentenv/agentenv/guest/agent/gen/filesystem"
	"github.com/agentenv/agentenv/guest/agent/gen/filesystem/filesystemconnect"
)

func setup(t *testing.T) (*agenttest.Server, filesystemconnect.FilesystemClient) {
	t.Helper()
	srv := agenttest.Start(t)
	return srv, filesystemconnect.NewFilesystemClient(agenttest.Client, srv.URL, connect.WithProtoJSON())
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o640); err != nil {
		t.Fatal(err)
	}
}

func TestStat(t *testing.T) {
	t.Parallel()
	srv, c := setup(t)
	dir := t.TempDir()
	write(t, filepath.Join(dir, "f.txt"), "12345")
	if err := os.Symlink("f.txt", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(srv.Home, "rel.txt"), "r")
	tests := []struct {
		name, path string
		typ        fspb.FileType
		size       int64
		wantPath   string
		perms      string
	}{
		{"file", filepath.Join(dir, "f.txt"), fspb.FileType_FILE_TYPE_FILE, 5, filepath.Join(dir, "f.txt"), "-rw-r-----"},
		{"dir", dir, fspb.FileType_FILE_TYPE_DIRECTORY, -1, dir, ""},
		{"symlink", filepath.Join(dir, "link"), fspb.FileType_FILE_TYPE_SYMLINK, -1, filepath.Join(dir, "link"), ""},
		{"relative to home", "rel.txt", fspb.FileType_FILE_TYPE_FILE, 1, filepath.Join(srv.Home, "rel.txt"), ""},
		{"tilde", "~/rel.txt", fspb.FileType_FILE_TYPE_FILE, 1, filepath.Join(srv.Home, "rel.txt"), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res, err := c.Stat(ctxT(t), connect.NewRequest(&fspb.StatRequest{Path: tc.path}))
			if err != nil {
				t.Fatal(err)
			}
			e := res.Msg.GetEntry()
			if e.GetType() != tc.typ || e.GetPath() != tc.wantPath || e.GetName() != filepath.Base(tc.wantPath) {
				t.Fatalf("entry %v", e)
			}
			if tc.size >= 0 && e.GetSize() != tc.size {
				t.Fatalf("size %d, want %d", e.GetSize(), tc.size)
			}
			if tc.perms != "" && (e.GetPermissions() != tc.perms || e.GetMode() != 0o640) {
				t.Fatalf("permissions %q mode %o", e.GetPermissions(), e.GetMode())
			}
			if e.GetOwner() == "" || e.GetGroup() == "" || e.GetModifiedTime().AsTime().IsZero() {
				t.Fatalf("owner/group/mtime missing: %v", e)
			}
			if tc.typ == fspb.FileType_FILE_TYPE_SYMLINK && e.GetSymlinkTarget() != filepath.Join(dir, "f.txt") {
				t.Fatalf("symlink target %q", e.GetSymlinkTarget())
			}
		})
	}
	t.Run("missing", func(t *testing.T) {
		_, err := c.Stat(ctxT(t), connect.NewRequest(&fspb.StatRequest{Path: filepath.Join(dir, "nope")}))
		if connect.CodeOf(err) != connect.CodeNotFound {
			t.Fatalf("got %v, want not_found", err)
		}
	})
	t.Run("empty path", func(t *testing.T) {
		_, err := c.Stat(ctxT(t), connect.NewRequest(&fspb.StatRequest{}))
		if connect.CodeOf(err) != connect.CodeInvalidArgument {
			t.Fatalf("got %v, want invalid_argument", err)
		}
	})
}

func TestStatOwnerNames(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	_, c := setup(t)
	p := filepath.Join(t.TempDir(), "owned")
	write(t, p, "x")
	if err := os.Chown(p, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	res, err := c.Stat(ctxT(t), connect.NewRequest(&fspb.StatRequest{Path: p}))
	if err != nil {
		t.Fatal(err)
	}
	if res.Msg.GetEntry().GetOwner() != "nobody" {
		t.Fatalf("owner %q, want nobody", res.Msg.GetEntry().GetOwner())
	}
}

func TestListDir(t *testing.T) {
	t.Parallel()
	_, c := setup(t)
	dir := t.TempDir()
	for _, p := range []string{"a.txt", "sub/b.txt", "sub/deeper/c.txt"} {
		write(t, filepath.Join(dir, p), p)
	}
	if err := os.Symlink(dir, filepath.Join(dir, "sub", "loop")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		depth uint32
		want  []string
	}{
		{0, []string{"a.txt", "sub"}},
		{1, []string{"a.txt", "sub"}},
		{2, []string{"a.txt", "sub", "sub/b.txt", "sub/deeper", "sub/loop"}},
		{10, []string{"a.txt", "sub", "sub/b.txt", "sub/deeper", "sub/deeper/c.txt", "sub/loop"}},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprint("depth ", tc.depth), func(t *testing.T) {
			t.Parallel()
			res, err := c.ListDir(ctxT(t), connect.NewRequest(&fspb.ListDirRequest{Path: dir, Depth: tc.depth}))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range res.Msg.GetEntries() {
				rel, _ := filepath.Rel(dir, e.GetPath())
				got = append(got, rel)
			}
			sort.Strings(got)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
	for name, tc := range map[string]struct {
		path string
		code connect.Code
	}{
		"missing":    {filepath.Join(dir, "nope"), connect.CodeNotFound},
		"not a dir":  {filepath.Join(dir, "a.txt"), connect.CodeInvalidArgument},
		"empty path": {"", connect.CodeInvalidArgument},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := c.ListDir(ctxT(t), connect.NewRequest(&fspb.ListDirRequest{Path: tc.path}))
			if connect.CodeOf(err) != tc.code {
				t.Fatalf("got %v, want %v", err, tc.code)
			}
		})
	}
}

func TestMakeDirMoveRemove(t *testing.T) {
	t.Parallel()
	srv, c := setup(t)
	dir := t.TempDir()
	nested := filepath.Join(dir, "x", "y", "z")
	res, err := c.MakeDir(ctxT(t), connect.NewRequest(&fspb.MakeDirRequest{Path: nested}))
	if err != nil {
		t.Fatal(err)
	}
	if res.Msg.GetEntry().GetType() != fspb.FileType_FILE_TYPE_DIRECTORY || res.Msg.GetEntry().GetPath() != nested {
		t.Fatalf("entry %v", res.Msg.GetEntry())
	}
	if _, err := c.MakeDir(ctxT(t), connect.NewRequest(&fspb.MakeDirRequest{Path: nested})); connect.CodeOf(err) != connect.CodeAlreadyExists {
		t.Fatalf("second MakeDir: %v, want already_exists", err)
	}
	write(t, filepath.Join(dir, "file"), "f")
	if _, err := c.MakeDir(ctxT(t), connect.NewRequest(&fspb.MakeDirRequest{Path: filepath.Join(dir, "file")})); connect.CodeOf(err) != connect.CodeInvalidArgument {
		t.Fatalf("MakeDir over a file: %v, want invalid_argument", err)
	}
	// Relative paths land in the home.
	if _, err := c.MakeDir(ctxT(t), connect.NewRequest(&fspb.MakeDirRequest{Path: "made"})); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(srv.Home, "made")); err != nil || !fi.IsDir() {
		t.Fatalf("relative MakeDir did not create in home: %v", err)
	}

	dst := filepath.Join(dir, "new", "parent", "moved")
	mv, err := c.Move(ctxT(t), connect.NewRequest(&fspb.MoveRequest{Source: filepath.Join(dir, "file"), Destination: dst}))
	if err != nil {
		t.Fatal(err)
	}
	if mv.Msg.GetEntry().GetPath() != dst {
		t.Fatalf("moved entry %v", mv.Msg.GetEntry())
	}
	if b, err := os.ReadFile(dst); err != nil || string(b) != "f" {
		t.Fatalf("moved content %q %v", b, err)
	}
	if _, err := c.Move(ctxT(t), connect.NewRequest(&fspb.MoveRequest{Source: filepath.Join(dir, "file"), Destination: dst})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("Move of a missing source: %v, want not_found", err)
	}

	if _, err := c.Remove(ctxT(t), connect.NewRequest(&fspb.RemoveRequest{Path: filepath.Join(dir, "x")})); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "x")); !os.IsNotExist(err) {
		t.Fatalf("tree not removed: %v", err)
	}
	// E2B's agent removes with a remove-all: a missing path is no error.
	for _, missing := range []string{filepath.Join(dir, "x"), filepath.Join(dir, "never", "was")} {
		if _, err := c.Remove(ctxT(t), connect.NewRequest(&fspb.RemoveRequest{Path: missing})); err != nil {
			t.Fatalf("Remove of the missing %s: %v, want success", missing, err)
		}
	}
}

func TestMakeDirAsOtherUserOwnsIt(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("chown needs root")
	}
	_, c := setup(t)
	p := filepath.Join(t.TempDir(), "a", "b")
	req := connect.NewRequest(&fspb.MakeDirRequest{Path: p})
	req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("nobody:")))
	res, err := c.MakeDir(ctxT(t), req)
	if err != nil {
		t.Fatal(err)
	}
	if res.Msg.GetEntry().GetOwner() != "nobody" {
		t.Fatalf("owner %q, want nobody", res.Msg.GetEntry().GetOwner())
	}
	parent, err := c.Stat(ctxT(t), connect.NewRequest(&fspb.StatRequest{Path: filepath.Dir(p)}))
	if err != nil || parent.Msg.GetEntry().GetOwner() != "nobody" {
		t.Fatalf("created parent not owned by nobody: %v %v", parent, err)
	}
}

// watchEvents collects events (name -> types) from a WatchDir stream until
// want is satisfied.
func TestWatchDir(t *testing.T) {
	t.Parallel()
	_, c := setup(t)
	for _, recursive := range []bool{false, true} {
		t.Run(fmt.Sprint("recursive=", recursive), func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			write(t, filepath.Join(dir, "old"), "o")
			if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			req := connect.NewRequest(&fspb.WatchDirRequest{Path: dir, Recursive: recursive, IncludeEntry: true})
			s, err := c.WatchDir(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if !s.Receive() || s.Msg().GetStart() == nil {
				t.Fatalf("first event is not start: %v %v", s.Msg(), s.Err())
			}
			write(t, filepath.Join(dir, "new"), "n")
			if err := os.Chmod(filepath.Join(dir, "new"), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(filepath.Join(dir, "old"), filepath.Join(dir, "renamed")); err != nil {
				t.Fatal(err)
			}
			if err := os.Remove(filepath.Join(dir, "renamed")); err != nil {
				t.Fatal(err)
			}
			write(t, filepath.Join(dir, "sub", "inner"), "i")
			write(t, filepath.Join(dir, "last"), "done")

			seen := map[string][]fspb.EventType{}
			var withEntry bool
			for !slices.Contains(seen["last"], fspb.EventType_EVENT_TYPE_CREATE) {
				if !s.Receive() {
					t.Fatalf("stream ended: %v (seen %v)", s.Err(), seen)
				}
				fe := s.Msg().GetFilesystem()
				if fe == nil {
					continue
				}
				seen[fe.GetName()] = append(seen[fe.GetName()], fe.GetType())
				if fe.GetName() == "new" && fe.GetType() == fspb.EventType_EVENT_TYPE_CREATE && fe.GetEntry().GetSize() >= 0 && fe.GetEntry() != nil {
					withEntry = true
				}
			}
			want := map[string]fspb.EventType{
				"new":     fspb.EventType_EVENT_TYPE_CREATE,
				"renamed": fspb.EventType_EVENT_TYPE_CREATE,
				"old":     fspb.EventType_EVENT_TYPE_RENAME,
			}
			for name, typ := range want {
				if !slices.Contains(seen[name], typ) {
					t.Errorf("no %v for %q; seen %v", typ, name, seen)
				}
			}
			if !slices.Contains(seen["new"], fspb.EventType_EVENT_TYPE_WRITE) || !slices.Contains(seen["new"], fspb.EventType_EVENT_TYPE_CHMOD) {
				t.Errorf("write/chmod of new missing: %v", seen["new"])
			}
			if !slices.Contains(seen["renamed"], fspb.EventType_EVENT_TYPE_REMOVE) {
				t.Errorf("remove missing: %v", seen["renamed"])
			}
			if !withEntry {
				t.Errorf("include_entry did not attach an entry to the create of new")
			}
			_, inner := seen[filepath.Join("sub", "inner")]
			if inner != recursive {
				t.Errorf("event for sub/inner seen=%v with recursive=%v", inner, recursive)
			}
		})
	}
	t.Run("new subdirectory is watched", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		s, err := c.WatchDir(ctx, connect.NewRequest(&fspb.WatchDirRequest{Path: dir, Recursive: true}))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		s.Receive()
		if err := os.Mkdir(filepath.Join(dir, "later"), 0o755); err != nil {
			t.Fatal(err)
		}
		want := filepath.Join("later", "x")
		deadline := time.Now().Add(10 * time.Second)
		for i := 0; ; i++ {
			// The watch on a new directory is added when its create event is
			// handled; keep writing until an event from inside arrives.
			write(t, filepath.Join(dir, "later", "x"), fmt.Sprint(i))
			if !s.Receive() {
				t.Fatal(s.Err())
			}
			if s.Msg().GetFilesystem().GetName() == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("no event from a directory created after the watch began")
			}
		}
	})
	t.Run("errors", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		write(t, filepath.Join(dir, "f"), "")
		for path, code := range map[string]connect.Code{
			filepath.Join(dir, "missing"): connect.CodeNotFound,
			filepath.Join(dir, "f"):       connect.CodeInvalidArgument,
		} {
			s, err := c.WatchDir(ctxT(t), connect.NewRequest(&fspb.WatchDirRequest{Path: path}))
			if err == nil {
				s.Receive()
				err = s.Err()
			}
			if connect.CodeOf(err) != code {
				t.Errorf("watch %s: %v, want %v", path, err, code)
			}
		}
	})
	t.Run("keepalive", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		req := connect.NewRequest(&fspb.WatchDirRequest{Path: t.TempDir()})
		req.Header().Set("Keepalive-Ping-Interval", "1")
		s, err := c.WatchDir(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		for s.Receive() {
			if s.Msg().GetKeepalive() != nil {
				return
			}
		}
		t.Fatalf("no keepalive: %v", s.Err())
	})
}

func TestPolledWatcher(t *testing.T) {
	t.Parallel()
	_, c := setup(t)
	dir := t.TempDir()
	cw, err := c.CreateWatcher(ctxT(t), connect.NewRequest(&fspb.CreateWatcherRequest{Path: dir, Recursive: true}))
	if err != nil {
		t.Fatal(err)
	}
	id := cw.Msg.GetWatcherId()
	if id == "" {
		t.Fatal("empty watcher id")
	}
	write(t, filepath.Join(dir, "a"), "1")
	var names []string
	for start := time.Now(); time.Since(start) < 10*time.Second && !slices.Contains(names, "a"); time.Sleep(20 * time.Millisecond) {
		ev, err := c.GetWatcherEvents(ctxT(t), connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range ev.Msg.GetEvents() {
			names = append(names, e.GetName())
		}
	}
	if !slices.Contains(names, "a") {
		t.Fatalf("no event for a; got %v", names)
	}
	// Events are handed out once.
	ev, err := c.GetWatcherEvents(ctxT(t), connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ev.Msg.GetEvents() {
		if e.GetName() == "a" && e.GetType() == fspb.EventType_EVENT_TYPE_CREATE {
			t.Fatalf("create of a delivered twice")
		}
	}
	if _, err := c.RemoveWatcher(ctxT(t), connect.NewRequest(&fspb.RemoveWatcherRequest{WatcherId: id})); err != nil {
		t.Fatal(err)
	}
	for name, call := range map[string]func() error{
		"GetWatcherEvents": func() error {
			_, err := c.GetWatcherEvents(ctxT(t), connect.NewRequest(&fspb.GetWatcherEventsRequest{WatcherId: id}))
			return err
		},
		"RemoveWatcher": func() error {
			_, err := c.RemoveWatcher(ctxT(t), connect.NewRequest(&fspb.RemoveWatcherRequest{WatcherId: id}))
			return err
		},
	} {
		if err := call(); connect.CodeOf(err) != connect.CodeNotFound {
			t.Errorf("%s of a removed watcher: %v, want not_found", name, err)
		}
	}
	if _, err := c.CreateWatcher(ctxT(t), connect.NewRequest(&fspb.CreateWatcherRequest{Path: filepath.Join(dir, "missing")})); connect.CodeOf(err) != connect.CodeNotFound {
		t.Fatalf("CreateWatcher on a missing dir: %v", err)
	}
}

// TestMetadataXattrs: a file's metadata is its user.e2b.* extended
// attributes, also ones set out-of-band, as E2B's agent keeps them.
func TestMetadataXattrs(t *testing.T) {
	t.Parallel()
	_, c := setup(t)
	p := filepath.Join(t.TempDir(), "m")
	write(t, p, "x")
	if err := syscall.Setxattr(p, "user.e2b.k", []byte("v"), 0); err != nil {
		t.Skipf("filesystem without user xattrs: %v", err)
	}
	if err := syscall.Setxattr(p, "user.other.k2", []byte("not metadata"), 0); err != nil {
		t.Fatal(err)
	}
	res, err := c.Stat(ctxT(t), connect.NewRequest(&fspb.StatRequest{Path: p}))
	if err != nil {
		t.Fatal(err)
	}
	if md := res.Msg.GetEntry().GetMetadata(); len(md) != 1 || md["k"] != "v" {
		t.Fatalf("metadata %v, want map[k:v]", md)
	}
	if fssvc.MetadataXattrPrefix != "user.e2b." {
		t.Fatalf("metadata prefix %q, want E2B's user.e2b.", fssvc.MetadataXattrPrefix)
	}
}
