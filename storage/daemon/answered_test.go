package daemon

import (
	"bytes"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/nbd"
)

// TestKillKeepsAnsweredWrites kills the daemon (SIGKILL) after it answered
// writes no flush covered yet, as a guest's page cache writeback leaves
// them, and has the client do what QEMU's NBD client does: reconnect to the
// restarted daemon and flush. The flush must cover those writes: they read
// back, and stay after a clean restart. Before the upper kept a journal of
// its pending mappings, the writes that needed new space read their old
// bytes after the restarted daemon had acknowledged the flush.
func TestKillKeepsAnsweredWrites(t *testing.T) {
	t.Parallel()
	r := newCrashRun(t, newFixture(t, 41), nil)
	ctx, dir := r.ctx, r.dir
	var err error
	r.spawn("")
	if r.a, err = r.c.Create(ctx, rpc.CreateParams{Image: r.fx.config, Owner: "t"}); err != nil {
		t.Fatal(err)
	}
	r.haveA = true
	if err := r.write(0, "flushed before the kill"); err != nil {
		t.Fatal(err)
	}
	nc, err := nbd.Dial(ctx, "unix", r.a.Socket, r.a.Export)
	if err != nil {
		t.Fatal(err)
	}
	for i, off := range []int64{8192, 1 << 20, 3<<20 + 512, 4096} {
		b := bytes.Repeat([]byte{byte('a' + i)}, 4096)
		if _, err := nc.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
		copy(r.want[off:], b)
	}
	if err := r.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-r.done
	nc.Close()
	r.spawn("")
	nc, err = nbd.Dial(ctx, "unix", r.a.Socket, r.a.Export)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	r.checkA("after the kill and a flush through the restarted daemon")
	if err := r.c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	<-r.done
	r.c = nil
	r.spawn("")
	r.checkA("after a clean restart")
	checkNoOrphans(t, filepath.Join(dir, "state"), filepath.Join(dir, "run"), r.list())
}
