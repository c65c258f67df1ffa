package devicestest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/storage/daemon/client"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/image"
	"github.com/agentenv/agentenv/storage/nbd"
)

func checkFeatures(t *testing.T, ctx context.Context, d client.Devices, _ *Image) {
	f, err := d.Features(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if f.ProtocolVersion != rpc.ProtocolVersion || !slices.Contains(f.Exports, "nbd") || !f.Restack || !f.SharedDevices || !f.WarmPool || !f.Assign || !f.Rebase {
		t.Fatalf("features %+v", f)
	}
	if devs := mustList(t, ctx, d); len(devs) != 0 {
		t.Fatalf("a fresh daemon lists %+v", devs)
	}
}

func checkCreateReadWrite(t *testing.T, ctx context.Context, d client.Devices, im *Image) {
	dev := mustCreate(t, ctx, d, rpc.CreateParams{Image: im.Config, Owner: "o"})
	if dev.Kind != rpc.KindRuntime || dev.State != rpc.StateActive || dev.ReadOnly || dev.Size != Size || dev.Owner != "o" {
		t.Fatalf("device %+v", dev)
	}
	nc := dial(t, ctx, dev)
	if !bytes.Equal(readAll(t, nc, Size), im.Want) {
		t.Fatal("a fresh device does not read as its image")
	}
	if _, err := nc.WriteAt([]byte("written"), 1<<20); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 7)
	if _, err := dial(t, ctx, dev).ReadAt(got, 1<<20); err != nil || string(got) != "written" {
		t.Fatalf("second connection reads %q %v", got, err)
	}
	ro := mustCreate(t, ctx, d, rpc.CreateParams{Image: im.Config, ReadOnly: true})
	if _, err := dial(t, ctx, ro).WriteAt([]byte("x"), 0); err == nil {
		t.Fatal("write to a read-only device succeeded")
	}
	devs := mustList(t, ctx, d)
	if len(devs) != 2 || devs[0].ID != dev.ID || devs[1].ID != ro.ID {
		t.Fatalf("list %+v", devs)
	}
}

func checkCreateInvalid(t *testing.T, ctx context.Context, d client.Devices, im *Image) {
	withUpper := filepath.Join(t.TempDir(), "with-upper.json")
	if _, err := image.Create(ctx, withUpper, image.CreateSpec{Lowers: []string{im.Layer}}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []rpc.CreateParams{
		{Image: ""},
		{Image: filepath.Join(t.TempDir(), "missing.json")},
		{Image: im.Config, Size: 1000},
		{Image: im.Config, Size: -512},
		{Image: withUpper},
	} {
		_, err := d.Create(ctx, p)
		wantErr(t, fmt.Sprintf("create %+v", p), err, rpc.ErrInvalid)
	}
	wantErr(t, "warm with a negative watermark", d.Warm(ctx, rpc.WarmParams{Image: im.Config, Low: -1}), rpc.ErrInvalid)
	_, err := d.Reclaim(ctx, "")
	wantErr(t, "reclaim without owner", err, rpc.ErrInvalid)
	_, err = d.AcquireShared(ctx, im.Config, "")
	wantErr(t, "acquire without holder", err, rpc.ErrInvalid)
	if devs := mustList(t, ctx, d); len(devs) != 0 {
		t.Fatalf("failed creates left %+v", devs)
	}
}

func checkNotFound(t *testing.T, ctx context.Context, d client.Devices, _ *Image) {
	wantErr(t, "delete", d.Delete(ctx, 42), rpc.ErrNotFound)
	_, err := d.Restack(ctx, rpc.RestackParams{ID: 42})
	wantErr(t, "restack", err, rpc.ErrNotFound)
	wantErr(t, "release", d.ReleaseShared(ctx, 42, "h"), rpc.ErrNotFound)
}

func checkDelete(t *testing.T, ctx context.Context, d client.Devices, im *Image) {
	dev := mustCreate(t, ctx, d, rpc.CreateParams{Image: im.Config})
	dial(t, ctx, dev)
	if err := d.Delete(ctx, dev.ID); err != nil {
		t.Fatal(err)
	}
	if c, err := nbd.Dial(ctx, "unix", dev.Socket, dev.Export); err == nil {
		c.Close()
		t.Fatal("a deleted device is still exported")
	}
	wantErr(t, "second delete", d.Delete(ctx, dev.ID), rpc.ErrNotFound)
	again := mustCreate(t, ctx, d, rpc.CreateParams{Image: im.Config})
	if again.Export == dev.Export {
		t.Fatalf("a new device reuses export name %s", dev.Export)
	}
	if !bytes.Equal(readAll(t, dial(t, ctx, again), Size), im.Want) {
		t.Fatal("a device made after a delete does not read as its image")
	}
}

func checkRestack(t *testing.T, ctx context.Context, d client.Devices, im *Image) {
	dev := mustCreate(t, ctx, d, rpc.CreateParams{Image: im.Config})
	nc := dial(t, ctx, dev)
	want := slices.Clone(im.Want)
	write := func(off int64, s string) {
		if _, err := nc.WriteAt([]byte(s), off); err != nil {
			t.Fatal(err)
		}
		copy(want[off:], s)
	}
	write(512, "first")
	res, err := d.Restack(ctx, rpc.RestackParams{ID: dev.ID, Message: "one"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Digest == "" || res.Size <= 0 || len(res.Device.Layers) != 2 || res.Device.Layers[1] != res.Layer || !slices.Equal(res.Layers, res.Device.Layers) {
		t.Fatalf("restack result %+v", res)
	}
	write(3<<20, "second") // the same connection goes on on the new stack
	if !bytes.Equal(readAll(t, nc, Size), want) {
		t.Fatal("device content wrong after restack")
	}
	checkFirstOnly(t, ctx, im, []string{im.Layer, res.Layer}, "the restack")
}

// checkFirstOnly checks that the sealed stack layers reads as im with
// "first" at 512 and nothing of "second" at 3 MiB: exactly the writes
// before the seal (what).
func checkFirstOnly(t *testing.T, ctx context.Context, im *Image, layers []string, what string) {
	t.Helper()
	sealed, err := image.OpenLayers(ctx, layers, image.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sealed.Close()
	got := readAll(t, sealed, Size)
	if string(got[512:517]) != "first" || !bytes.Equal(got[3<<20:3<<20+6], im.Want[3<<20:3<<20+6]) {
		t.Fatalf("the layer sealed by %s does not hold exactly the writes before it", what)
	}
}

// checkSealKeep: a seal that keeps the upper (rpc.RestackParams.Keep)
// writes a layer holding exactly the writes so far and leaves the device as
// it was: same layers, same bytes, writes go on into the same upper.
func checkSealKeep(t *testing.T, ctx context.Context, d client.Devices, im *Image) {
	dev := mustCreate(t, ctx, d, rpc.CreateParams{Image: im.Config})
	nc := dial(t, ctx, dev)
	want := slices.Clone(im.Want)
	if _, err := nc.WriteAt([]byte("first"), 512); err != nil {
		t.Fatal(err)
	}
	copy(want[512:], "first")
	if _, err := d.Restack(ctx, rpc.RestackParams{ID: dev.ID, Keep: true}); !errors.Is(err, rpc.ErrInvalid) {
		t.Fatalf("a kept seal without a layer path: %v, want an invalid-request error", err)
	}
	layer := filepath.Join(t.TempDir(), "kept.lsmt")
	res, err := d.Restack(ctx, rpc.RestackParams{ID: dev.ID, Layer: layer, Keep: true, Message: "kept"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Layer != layer || res.Digest == "" || res.Size <= 0 || !slices.Equal(res.Layers, []string{im.Layer, layer}) ||
		!slices.Equal(res.Device.Layers, []string{im.Layer}) {
		t.Fatalf("kept seal result %+v: want the layer on the image's stack and the device on its own", res)
	}
	if _, err := d.Restack(ctx, rpc.RestackParams{ID: dev.ID, Layer: layer, Keep: true}); !errors.Is(err, rpc.ErrConflict) {
		t.Fatalf("a kept seal onto an existing layer: %v, want a conflict", err)
	}
	if _, err := nc.WriteAt([]byte("second"), 3<<20); err != nil { // the same upper goes on
		t.Fatal(err)
	}
	copy(want[3<<20:], "second")
	if !bytes.Equal(readAll(t, nc, Size), want) {
		t.Fatal("device content wrong after a kept seal")
	}
	checkFirstOnly(t, ctx, im, res.Layers, "the kept seal")
	again, err := d.Restack(ctx, rpc.RestackParams{ID: dev.ID, Message: "after"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(again.Device.Layers, []string{im.Layer, again.Layer}) {
		t.Fatalf("a restack after a kept seal stacks %v, want the image's layer and its own", again.Device.Layers)
	}
}

func checkRestackConflicts(t *testing.T, ctx context.Context, d client.Devices, im *Image) {
	ro := mustCreate(t, ctx, d, rpc.CreateParams{Image: im.Config, ReadOnly: true})
	_, err := d.Restack(ctx, rpc.RestackParams{ID: ro.ID})
	wantErr(t, "restack of a read-only device", err, rpc.ErrConflict)
	dev := mustCreate(t, ctx, d, rpc.CreateParams{Image: im.Config})
	_, err = d.Restack(ctx, rpc.RestackParams{ID: dev.ID, Layer: im.Layer})
	wantErr(t, "restack onto an existing file", err, rpc.ErrConflict)
	sh, err := d.AcquireShared(ctx, im.Config, "h")
	if err != nil {
		t.Fatal(err)
	}
	_, err = d.Restack(ctx, rpc.RestackParams{ID: sh.ID})
	wantErr(t, "restack of a shared device", err, rpc.ErrConflict)
	if !bytes.Equal(readAll(t, dial(t, ctx, dev), Size), im.Want) {
		t.Fatal("a refused restack changed the device")
	}
	if ok, err := image.OpenLayers(ctx, []string{im.Layer}, image.Options{}); err != nil {
		t.Fatalf("a refused restack damaged the existing layer: %v", err)
	} else {
		ok.Close()
	}
}

func checkShared(t *testing.T, ctx context.Context, d client.Devices, im *Image) {
	a, err := d.AcquireShared(ctx, im.Config, "vm-a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := d.Acquire(ctx, rpc.AcquireParams{Image: im.Config, Holder: "vm-b"})
	if err != nil {
		t.Fatal(err)
	}
	if a.ID != b.ID || b.Kind != rpc.KindShared || !b.ReadOnly || !slices.Equal(b.Holders, []string{"vm-a", "vm-b"}) {
		t.Fatalf("two acquires: %+v / %+v", a, b)
	}
	if !bytes.Equal(readAll(t, dial(t, ctx, b), Size), im.Want) {
		t.Fatal("shared device content differs")
	}
	wantErr(t, "delete of a shared device", d.Delete(ctx, a.ID), rpc.ErrConflict)
	if err := d.ReleaseShared(ctx, a.ID, "vm-a"); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "double release", d.ReleaseShared(ctx, a.ID, "vm-a"), rpc.ErrNotFound)
	dev := mustCreate(t, ctx, d, rpc.CreateParams{Image: im.Config})
	wantErr(t, "release of a runtime device", d.ReleaseShared(ctx, dev.ID, "vm-b"), rpc.ErrConflict)
	if err := d.ReleaseShared(ctx, a.ID, "vm-b"); err != nil {
		t.Fatal(err)
	}
	if c, err := nbd.Dial(ctx, "unix", b.Socket, b.Export); err == nil {
		c.Close()
		t.Fatal("shared device exported after its last release")
	}
}

func checkReclaim(t *testing.T, ctx context.Context, d client.Devices, im *Image) {
	keep := mustCreate(t, ctx, d, rpc.CreateParams{Image: im.Config, Owner: "aenvd"})
	drop := mustCreate(t, ctx, d, rpc.CreateParams{Image: im.Config, Owner: "aenvd"})
	other := mustCreate(t, ctx, d, rpc.CreateParams{Image: im.Config, Owner: "other"})
	sh, err := d.AcquireShared(ctx, im.Config, "aenvd/sb-1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.AcquireShared(ctx, im.Config, "other/sb-2"); err != nil {
		t.Fatal(err)
	}
	res, err := d.Reclaim(ctx, "aenvd", keep.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Deleted, []uint32{drop.ID}) || !slices.Equal(res.Released, []uint32{sh.ID}) {
		t.Fatalf("reclaim %+v", res)
	}
	var ids []uint32
	for _, dev := range mustList(t, ctx, d) {
		ids = append(ids, dev.ID)
	}
	if !slices.Equal(ids, []uint32{keep.ID, other.ID, sh.ID}) {
		t.Fatalf("devices after reclaim: %v", ids)
	}
	if res, err := d.Reclaim(ctx, "aenvd", keep.ID); err != nil || len(res.Deleted)+len(res.Released) != 0 {
		t.Fatalf("second reclaim: %+v %v", res, err)
	}
}

// checkAssign: a runtime device changes owner (and is listed so); a shared
// device, an unknown one or an empty owner is refused.
func checkAssign(t *testing.T, ctx context.Context, d client.Devices, im *Image) {
	dev := mustCreate(t, ctx, d, rpc.CreateParams{Image: im.Config, Owner: "before"})
	if got, err := d.Assign(ctx, rpc.AssignParams{ID: dev.ID, Owner: "after"}); err != nil || got.Owner != "after" || got.ID != dev.ID {
		t.Fatalf("assign: %+v %v", got, err)
	}
	if devs := mustList(t, ctx, d); len(devs) != 1 || devs[0].Owner != "after" {
		t.Fatalf("list after assign: %+v", devs)
	}
	sh, err := d.AcquireShared(ctx, im.Config, "vm")
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		p    rpc.AssignParams
		want error
	}{
		"shared":   {rpc.AssignParams{ID: sh.ID, Owner: "x"}, rpc.ErrConflict},
		"unknown":  {rpc.AssignParams{ID: 999, Owner: "x"}, rpc.ErrNotFound},
		"no owner": {rpc.AssignParams{ID: dev.ID}, rpc.ErrInvalid},
	} {
		if _, err := d.Assign(ctx, c.p); !errors.Is(err, c.want) {
			t.Errorf("assign %s: got %v, want %v", name, err, c.want)
		}
	}
}

func checkWarmPool(t *testing.T, ctx context.Context, d client.Devices, im *Image) {
	if err := d.Warm(ctx, rpc.WarmParams{Image: im.Config, Low: 1, High: 2}); err != nil {
		t.Fatal(err)
	}
	var pool []uint32
	for len(pool) < 2 {
		pool = pool[:0]
		for _, dev := range mustList(t, ctx, d) {
			if dev.Kind == rpc.KindPool {
				pool = append(pool, dev.ID)
			}
		}
		if len(pool) > 2 {
			t.Fatalf("pool past its high watermark: %v", pool)
		}
		time.Sleep(10 * time.Millisecond)
	}
	dev := mustCreate(t, ctx, d, rpc.CreateParams{Image: im.Config, Owner: "sb"})
	if !slices.Contains(pool, dev.ID) || dev.Kind != rpc.KindRuntime || dev.Owner != "sb" {
		t.Fatalf("create did not take a pool device: %+v (pool %v)", dev, pool)
	}
	if !bytes.Equal(readAll(t, dial(t, ctx, dev), Size), im.Want) {
		t.Fatal("pool device content differs")
	}
}

func checkCapacity(t *testing.T, ctx context.Context, d client.Devices, im *Image) {
	a := mustCreate(t, ctx, d, rpc.CreateParams{Image: im.Config})
	mustCreate(t, ctx, d, rpc.CreateParams{Image: im.Config})
	_, err := d.Create(ctx, rpc.CreateParams{Image: im.Config})
	wantErr(t, "create beyond the device limit", err, rpc.ErrCapacity)
	if err := d.Delete(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	mustCreate(t, ctx, d, rpc.CreateParams{Image: im.Config})
}

func checkConcurrent(t *testing.T, ctx context.Context, d client.Devices, im *Image) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	ids := map[uint32]bool{}
	for g := range 6 {
		wg.Go(func() {
			for range 2 {
				dev, err := d.Create(ctx, rpc.CreateParams{Image: im.Config, Owner: fmt.Sprint(g)})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if ids[dev.ID] {
					t.Errorf("device id %d handed out twice", dev.ID)
				}
				ids[dev.ID] = true
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if devs := mustList(t, ctx, d); len(devs) != 12 {
		t.Fatalf("%d devices after 12 concurrent creates", len(devs))
	}
}
