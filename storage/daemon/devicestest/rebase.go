package devicestest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/agentenv/agentenv/storage/daemon/client"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/image"
)

// checkRebase: a device never written moves onto another image's lowers
// under its live export (a client connected before reads the new image);
// a device written to, a shared device, an unknown one and an image of
// another size are refused, the latter leaving the device as it was.
func checkRebase(t *testing.T, ctx context.Context, d client.Devices, im *Image) {
	other, want := sealedVariant(t, ctx, d, im)
	dev := mustCreate(t, ctx, d, rpc.CreateParams{Image: im.Config, Owner: "pool"})
	nc := dial(t, ctx, dev) // a VMM waiting for its state
	if !bytes.Equal(readAll(t, nc, Size), im.Want) {
		t.Fatal("fresh device does not read as its image")
	}
	got, err := d.Rebase(ctx, rpc.RebaseParams{ID: dev.ID, Image: other.Config})
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != dev.ID || got.Socket != dev.Socket || got.Export != dev.Export || !slices.Equal(got.Layers, other.Layers) {
		t.Fatalf("rebased device %+v: want device %d on %v, same export", got, dev.ID, other.Layers)
	}
	if !bytes.Equal(readAll(t, nc, Size), want) {
		t.Fatal("after the rebase the open connection does not read the new image")
	}
	if _, err := nc.WriteAt([]byte("mine"), 8192); err != nil {
		t.Fatal(err)
	}
	copy(want[8192:], "mine")
	if _, err := d.Rebase(ctx, rpc.RebaseParams{ID: dev.ID, Image: im.Config}); !errors.Is(err, rpc.ErrConflict) {
		t.Fatalf("rebase of a written device: %v, want a conflict", err)
	}
	res, err := d.Restack(ctx, rpc.RestackParams{ID: dev.ID, Message: "after the rebase"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Layers, append(slices.Clone(other.Layers), res.Layer)) {
		t.Fatalf("restack after the rebase stacks %v, want %v and its layer", res.Layers, other.Layers)
	}
	if !bytes.Equal(readAll(t, nc, Size), want) {
		t.Fatal("device content wrong after the rebase, a write and a restack")
	}
	checkRebaseRefusals(t, ctx, d, im)
}

// checkRebaseRefusals: what a rebase refuses, and that a refused rebase
// changes nothing.
func checkRebaseRefusals(t *testing.T, ctx context.Context, d client.Devices, im *Image) {
	small := smallImage(t, ctx)
	dev := mustCreate(t, ctx, d, rpc.CreateParams{Image: im.Config})
	sh, err := d.AcquireShared(ctx, im.Config, "vm")
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		p    rpc.RebaseParams
		want error
	}{
		"another size": {rpc.RebaseParams{ID: dev.ID, Image: small}, rpc.ErrInvalid},
		"no image":     {rpc.RebaseParams{ID: dev.ID, Image: filepath.Join(t.TempDir(), "none.json")}, rpc.ErrInvalid},
		"shared":       {rpc.RebaseParams{ID: sh.ID, Image: im.Config}, rpc.ErrConflict},
		"unknown":      {rpc.RebaseParams{ID: 999, Image: im.Config}, rpc.ErrNotFound},
	} {
		if _, err := d.Rebase(ctx, c.p); !errors.Is(err, c.want) {
			t.Errorf("rebase %s: got %v, want %v", name, err, c.want)
		}
	}
	devs := mustList(t, ctx, d)
	i := slices.IndexFunc(devs, func(x rpc.Device) bool { return x.ID == dev.ID })
	if i < 0 || !slices.Equal(devs[i].Layers, []string{im.Layer}) {
		t.Fatalf("device after refused rebases: %+v", devs)
	}
	if !bytes.Equal(readAll(t, dial(t, ctx, dev), Size), im.Want) {
		t.Fatal("a refused rebase changed the device's bytes")
	}
}

// sealedVariant makes an image of im's size on im's layer and one more,
// through the daemon (a write sealed by a kept seal), and returns its
// config with its layers and its bytes.
func sealedVariant(t *testing.T, ctx context.Context, d client.Devices, im *Image) (variant struct {
	Config string
	Layers []string
}, want []byte) {
	t.Helper()
	src := mustCreate(t, ctx, d, rpc.CreateParams{Image: im.Config})
	nc := dial(t, ctx, src)
	want = slices.Clone(im.Want)
	if _, err := nc.WriteAt([]byte("the variant"), 1<<20); err != nil {
		t.Fatal(err)
	}
	copy(want[1<<20:], "the variant")
	dir := t.TempDir()
	res, err := d.Restack(ctx, rpc.RestackParams{ID: src.ID, Layer: filepath.Join(dir, "variant.lsmt"), Keep: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Delete(ctx, src.ID); err != nil {
		t.Fatal(err)
	}
	cfg := &image.Config{}
	for _, l := range res.Layers {
		cfg.Lowers = append(cfg.Lowers, image.LayerRef{File: l})
	}
	variant.Config, variant.Layers = filepath.Join(dir, "variant.json"), res.Layers
	if err := cfg.Save(variant.Config); err != nil {
		t.Fatal(err)
	}
	return variant, want
}

// smallImage writes a one-layer image of 1 MiB and returns its config.
func smallImage(t *testing.T, ctx context.Context) string {
	t.Helper()
	dir := t.TempDir()
	raw, layer, cfg := filepath.Join(dir, "small.raw"), filepath.Join(dir, "small.lsmt"), filepath.Join(dir, "small.json")
	if err := os.WriteFile(raw, bytes.Repeat([]byte{1}, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := image.ImportRaw(ctx, raw, layer, image.CommitOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := (&image.Config{Lowers: []image.LayerRef{{File: layer}}}).Save(cfg); err != nil {
		t.Fatal(err)
	}
	return cfg
}
