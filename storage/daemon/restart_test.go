package daemon

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/agentenv/agentenv/storage/daemon/client"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/nbd"
)

// TestClientDeathKeepsDevices: a client that goes away leaves its devices
// exported; a new client sees and uses them.
func TestClientDeathKeepsDevices(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 5)
	h := start(t, testOptions(t))
	c1, err := client.Dial(ctxT(t), h.opts.Socket)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := c1.Create(ctxT(t), rpc.CreateParams{Image: f.config})
	if err != nil {
		t.Fatal(err)
	}
	c1.Close()
	devs, err := h.c.List(ctxT(t))
	if err != nil || len(devs) != 1 || devs[0].ID != dev.ID {
		t.Fatalf("devices after client death: %+v %v", devs, err)
	}
	dialDev(t, dev)
}

// TestRestart: a restarted daemon re-exports devices with their data, and
// reports lost the ones whose layers changed instead of serving them.
func TestRestart(t *testing.T) {
	t.Parallel()
	good, changed := newFixture(t, 6), newFixture(t, 7)
	opts := testOptions(t)
	h := start(t, opts)
	ctx := ctxT(t)
	a, err := h.c.Create(ctx, rpc.CreateParams{Image: good.config, Owner: "x"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := h.c.Create(ctx, rpc.CreateParams{Image: changed.config})
	if err != nil {
		t.Fatal(err)
	}
	sh, err := h.c.AcquireShared(ctx, good.config, "vm")
	if err != nil {
		t.Fatal(err)
	}
	nc := dialDev(t, a)
	if _, err := nc.WriteAtFUA([]byte("survives restart"), 12345); err != nil {
		t.Fatal(err)
	}
	h.stop()

	// Rewrite the other device's base layer with different content.
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(changed.base, later, later); err != nil {
		t.Fatal(err)
	}
	h2 := start(t, opts)
	devs, err := h2.c.List(ctx)
	if err != nil || len(devs) != 3 {
		t.Fatalf("devices after restart: %+v %v", devs, err)
	}
	byID := map[uint32]rpc.Device{}
	for _, d := range devs {
		byID[d.ID] = d
	}
	if d := byID[a.ID]; d.State != rpc.StateActive || d.Socket != a.Socket || d.Export != a.Export || d.Owner != "x" {
		t.Fatalf("device a after restart: %+v", d)
	}
	got := make([]byte, 16)
	if _, err := dialDev(t, a).ReadAt(got, 12345); err != nil || string(got) != "survives restart" {
		t.Fatalf("data after restart: %q %v", got, err)
	}
	if d := byID[sh.ID]; d.State != rpc.StateActive || d.Kind != rpc.KindShared || !slices.Equal(d.Holders, []string{"vm"}) {
		t.Fatalf("shared device after restart: %+v", d)
	}
	if d := byID[b.ID]; d.State != rpc.StateLost || d.LostReason == "" || d.Socket != "" {
		t.Fatalf("device with a changed layer: %+v", d)
	}
	if _, err := nbd.Dial(ctx, "unix", b.Socket, b.Export); err == nil {
		t.Fatal("a lost device is still served")
	}
	if _, err := h2.c.Restack(ctx, rpc.RestackParams{ID: b.ID}); !isCode(err, rpc.CodeLost) {
		t.Fatalf("restack of lost device: %v", err)
	}
	if err := h2.c.Delete(ctx, b.ID); err != nil {
		t.Fatalf("delete lost device: %v", err)
	}
	// The shared device is found again by image, not duplicated.
	again, err := h2.c.AcquireShared(ctx, good.config, "vm2")
	if err != nil || again.ID != sh.ID {
		t.Fatalf("acquire after restart: %+v %v", again, err)
	}
}

func TestSecondDaemonRefused(t *testing.T) {
	t.Parallel()
	opts := testOptions(t)
	start(t, opts)
	opts2 := opts
	opts2.Socket = filepath.Join(t.TempDir(), "other.sock")
	d2, err := New(opts2)
	if err != nil {
		t.Fatal(err)
	}
	if err := d2.Run(ctxT(t)); err == nil {
		t.Fatal("a second daemon ran on the same state directory")
	}
}

// TestRestartAfterRestack: a restacked device comes back on its newest
// generation with the writes from before and after the restack; the old
// generation's files are gone.
func TestRestartAfterRestack(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 14)
	opts := testOptions(t)
	h := start(t, opts)
	ctx := ctxT(t)
	dev, err := h.c.Create(ctx, rpc.CreateParams{Image: f.config})
	if err != nil {
		t.Fatal(err)
	}
	nc := dialDev(t, dev)
	nc.WriteAt([]byte("before"), 0)
	res, err := h.c.Restack(ctx, rpc.RestackParams{ID: dev.ID})
	if err != nil {
		t.Fatal(err)
	}
	nc.WriteAt([]byte("after!"), 4096)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	h.stop()
	for _, old := range []string{"image.0.json", "upper.0.data", "upper.0.index"} {
		if _, err := os.Stat(filepath.Join(opts.StateDir, "devices", "0", old)); !os.IsNotExist(err) {
			t.Errorf("old generation file %s still there: %v", old, err)
		}
	}
	h2 := start(t, opts)
	devs, err := h2.c.List(ctx)
	if err != nil || len(devs) != 1 || devs[0].State != rpc.StateActive || !slices.Contains(devs[0].Layers, res.Layer) {
		t.Fatalf("after restart: %+v %v", devs, err)
	}
	nc2 := dialDev(t, devs[0])
	got := make([]byte, 4102)
	if _, err := nc2.ReadAt(got, 0); err != nil || string(got[:6]) != "before" || string(got[4096:]) != "after!" {
		t.Fatalf("after restart: %q %q %v", got[:6], got[4096:], err)
	}
}
