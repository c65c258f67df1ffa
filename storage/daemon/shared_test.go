package daemon

import (
	"bytes"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/storage/daemon/client"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/image"
	"github.com/agentenv/agentenv/storage/nbd"
)

func TestSharedDevice(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3)
	h := start(t, testOptions(t))
	ctx := ctxT(t)
	a, err := h.c.AcquireShared(ctx, f.config, "vm-a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := h.c.AcquireShared(ctx, f.config, "vm-b")
	if err != nil {
		t.Fatal(err)
	}
	if a.ID != b.ID || a.Socket != b.Socket || !b.ReadOnly || len(b.Holders) != 2 {
		t.Fatalf("two acquires: %+v / %+v", a, b)
	}
	if got := readAll(t, dialDev(t, b), diskSize); !bytes.Equal(got, f.want) {
		t.Fatal("shared device content differs")
	}
	if err := h.c.Delete(ctx, a.ID); !isCode(err, rpc.CodeConflict) {
		t.Fatalf("delete of a shared device: %v", err)
	}
	if err := h.c.ReleaseShared(ctx, a.ID, "vm-a"); err != nil {
		t.Fatal(err)
	}
	if err := h.c.ReleaseShared(ctx, a.ID, "vm-a"); !isCode(err, rpc.CodeNotFound) {
		t.Fatalf("double release: %v", err)
	}
	dialDev(t, b) // still exported for vm-b
	if err := h.c.ReleaseShared(ctx, a.ID, "vm-b"); err != nil {
		t.Fatal(err)
	}
	if _, err := nbd.Dial(ctx, "unix", b.Socket, b.Export); err == nil {
		t.Fatal("shared device exported after its last release")
	}
	devs, _ := h.c.List(ctx)
	if len(devs) != 0 {
		t.Fatalf("devices left: %+v", devs)
	}
}

func TestReclaim(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 4)
	h := start(t, testOptions(t))
	ctx := ctxT(t)
	keep, _ := h.c.Create(ctx, rpc.CreateParams{Image: f.config, Owner: "aenvd"})
	drop, _ := h.c.Create(ctx, rpc.CreateParams{Image: f.config, Owner: "aenvd"})
	other, _ := h.c.Create(ctx, rpc.CreateParams{Image: f.config, Owner: "someone-else"})
	sh, _ := h.c.AcquireShared(ctx, f.config, "aenvd/sb-1")
	h.c.AcquireShared(ctx, f.config, "other/sb-2")
	res, err := h.c.Reclaim(ctx, "aenvd", keep.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Deleted, []uint32{drop.ID}) || !slices.Equal(res.Released, []uint32{sh.ID}) {
		t.Fatalf("reclaim %+v", res)
	}
	devs, _ := h.c.List(ctx)
	var ids []uint32
	for _, d := range devs {
		ids = append(ids, d.ID)
		if d.ID == sh.ID && !slices.Equal(d.Holders, []string{"other/sb-2"}) {
			t.Fatalf("shared holders after reclaim: %v", d.Holders)
		}
	}
	if !slices.Equal(ids, []uint32{keep.ID, other.ID, sh.ID}) {
		t.Fatalf("devices after reclaim: %v", ids)
	}
}

// TestConcurrentClients: several clients create, delete, acquire and
// release at once; afterwards exactly one shared device holds every
// remaining holder and no runtime device is left.
func TestConcurrentClients(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 15)
	h := start(t, testOptions(t))
	ctx := ctxT(t)
	var wg sync.WaitGroup
	sharedIDs := make([]uint32, 6)
	for g := range 6 {
		wg.Go(func() {
			c, err := client.Dial(ctx, h.opts.Socket)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			holder := fmt.Sprintf("vm-%d", g)
			sh, err := c.AcquireShared(ctx, f.config, holder)
			if err != nil {
				t.Error(err)
				return
			}
			sharedIDs[g] = sh.ID
			for range 3 {
				dev, err := c.Create(ctx, rpc.CreateParams{Image: f.config, Owner: holder})
				if err != nil {
					t.Error(err)
					return
				}
				if err := c.Delete(ctx, dev.ID); err != nil {
					t.Error(err)
					return
				}
			}
			if g%2 == 0 {
				if err := c.ReleaseShared(ctx, sh.ID, holder); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	for _, id := range sharedIDs[1:] {
		if id != sharedIDs[0] {
			t.Fatalf("one image got several shared devices: %v", sharedIDs)
		}
	}
	devs, err := h.c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 1 || devs[0].Kind != rpc.KindShared {
		t.Fatalf("devices left: %+v", devs)
	}
	holders := slices.Sorted(slices.Values(devs[0].Holders))
	if !slices.Equal(holders, []string{"vm-1", "vm-3", "vm-5"}) {
		t.Fatalf("holders %v", holders)
	}
}

// repoint rewrites an image config in place to name other's base layer, as
// a template rebuild at the same path would.
func repoint(t *testing.T, f, other *fixture) {
	t.Helper()
	time.Sleep(10 * time.Millisecond) // a distinct mtime even on coarse clocks
	if err := (&image.Config{Lowers: []image.LayerRef{{File: other.base}}}).Save(f.config); err != nil {
		t.Fatal(err)
	}
}

// TestStaleSharedAndPool: after an image config changes, acquire gives new
// holders a fresh shared export (old holders keep theirs) and create never
// hands out a pool device made from the old layers.
func TestStaleSharedAndPool(t *testing.T) {
	t.Parallel()
	f, other := newFixture(t, 16), newFixture(t, 17)
	h := start(t, testOptions(t))
	ctx := ctxT(t)
	old, err := h.c.AcquireShared(ctx, f.config, "old-vm")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.c.Warm(ctx, rpc.WarmParams{Image: f.config, Low: 1, High: 1}); err != nil {
		t.Fatal(err)
	}
	pool := waitPool(t, h.c, 1)
	repoint(t, f, other)

	fresh, err := h.c.AcquireShared(ctx, f.config, "new-vm")
	if err != nil {
		t.Fatal(err)
	}
	if fresh.ID == old.ID {
		t.Fatal("a changed image reused the old shared export")
	}
	if got := readAll(t, dialDev(t, fresh), diskSize); !bytes.Equal(got, other.want) {
		t.Fatal("fresh shared export does not serve the new image")
	}
	if got := readAll(t, dialDev(t, old), diskSize); !bytes.Equal(got, f.want) {
		t.Fatal("old holders lost their export")
	}
	if err := h.c.ReleaseShared(ctx, old.ID, "old-vm"); err != nil {
		t.Fatal(err)
	}
	again, err := h.c.AcquireShared(ctx, f.config, "third-vm")
	if err != nil || again.ID != fresh.ID {
		t.Fatalf("acquire after the change settled: %+v %v (want device %d)", again, err, fresh.ID)
	}

	dev, err := h.c.Create(ctx, rpc.CreateParams{Image: f.config})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(pool, dev.ID) && dev.Layers[0] != other.base {
		t.Fatalf("create handed out the stale pool device %d", dev.ID)
	}
	if got := readAll(t, dialDev(t, dev), diskSize); !bytes.Equal(got, other.want) {
		t.Fatal("created device does not serve the new image")
	}
}
