package daemon

import (
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/agentenv/agentenv/storage/daemon/rpc"
)

// TestStatePrivate: the state directory is 0700 and the run directory
// 0711 (searchable by a VMM chrooted into it, never listable), even when
// they existed with a wider mode; every state file 0600, every socket 0600:
// they hold and serve every sandbox's disk.
func TestStatePrivate(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 51)
	opts := testOptions(t)
	for _, dir := range []string{opts.StateDir, opts.RunDir} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	h := start(t, opts)
	ctx := ctxT(t)
	dev, err := h.c.Create(ctx, rpc.CreateParams{Image: f.config})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.c.Restack(ctx, rpc.RestackParams{ID: dev.ID}); err != nil {
		t.Fatal(err)
	}
	if err := h.c.Warm(ctx, rpc.WarmParams{Image: f.config, Low: 1, High: 1}); err != nil {
		t.Fatal(err)
	}
	waitPool(t, h.c, 1)
	for _, root := range []string{opts.StateDir, opts.RunDir} {
		err := filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := e.Info()
			if err != nil {
				return err
			}
			want := os.FileMode(0o600)
			switch {
			case p == opts.RunDir:
				want = 0o711
			case fi.IsDir():
				want = 0o700
			}
			if fi.Mode().Perm() != want {
				t.Errorf("%s has mode %v, want %v", p, fi.Mode().Perm(), want)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, sock := range []string{opts.Socket, dev.Socket} {
		fi, err := os.Stat(sock)
		if err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
			t.Errorf("socket %s: %v %v, want a 0600 socket", sock, fi.Mode(), err)
		}
	}
}

// TestConnectAs: a device made for a confined VMM has its socket owned by
// that identity, 0600, whether made fresh or claimed from the warm pool,
// and again after a restart of the daemon (which makes new sockets); an
// identity of -1 (chown's "unchanged") is refused.
func TestConnectAs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("chowning sockets to another uid needs root")
	}
	f := newFixture(t, 52)
	opts := testOptions(t)
	h := start(t, opts)
	ctx := ctxT(t)
	as := &rpc.Identity{UID: 2000000101, GID: 2000000102}
	fresh, err := h.c.Create(ctx, rpc.CreateParams{Image: f.config, ConnectAs: as})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.c.Warm(ctx, rpc.WarmParams{Image: f.config, Low: 1, High: 1}); err != nil {
		t.Fatal(err)
	}
	waitPool(t, h.c, 1)
	pooled, err := h.c.Create(ctx, rpc.CreateParams{Image: f.config, ConnectAs: &rpc.Identity{UID: 2000000103, GID: 2000000103}})
	if err != nil {
		t.Fatal(err)
	}
	check := func(when string, dev rpc.Device, uid, gid uint32) {
		t.Helper()
		fi, err := os.Stat(dev.Socket)
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if st.Uid != uid || st.Gid != gid || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: socket %s is %d:%d %v, want %d:%d 0600", when, dev.Socket, st.Uid, st.Gid, fi.Mode().Perm(), uid, gid)
		}
	}
	check("made", fresh, as.UID, as.GID)
	check("claimed from the pool", pooled, 2000000103, 2000000103)
	h.stop()
	h = start(t, opts)
	check("after a restart", fresh, as.UID, as.GID)
	check("claimed, after a restart", pooled, 2000000103, 2000000103)
	_, err = h.c.Create(ctx, rpc.CreateParams{Image: f.config, ConnectAs: &rpc.Identity{UID: ^uint32(0), GID: 5}})
	if !isCode(err, rpc.CodeInvalid) {
		t.Fatalf("connect_as -1: %v, want invalid", err)
	}
}
