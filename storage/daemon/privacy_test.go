package daemon

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/storage/daemon/rpc"
)

// TestStatePrivate: the state and run directories are 0700 (even when they
// existed with a wider mode), every state file 0600, every socket 0600:
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
			if fi.IsDir() {
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
