package disk

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	storimage "github.com/agentenv/agentenv/storage/image"
)

// SealMode says what a seal leaves the device on.
type SealMode bool

const (
	// RestackUpper: a fresh upper stacked on the sealed layer, for a VM
	// that runs on (a snapshot of a running sandbox).
	RestackUpper SealMode = false
	// KeepUpper: its own upper, unchanged, for a device deleted next (a
	// pause, a kill, a build's commit), whose VM can still run on from
	// where it was if what follows the seal fails. It spares the daemon a
	// new generation to write and open (rpc.RestackParams.Keep).
	KeepUpper SealMode = true
)

// Held is a device owner holds, whose seals go into dir.
type Held struct {
	Owner, Dir string
	Device     uint32
	Has        bool
}

// Seal (vCPUs stopped, drives flushed) seals h's device's upper into a new
// layer <dir>/<name>.lsmt (<name>.<k>.lsmt when a seal of the same
// generation exists already: a pause that failed after its seal and was
// retried, or a recovery) and writes the config listing the stack the
// sealed layer completes next to it: the daemon's list is the truth. It
// returns that config. The device stays (on a fresh upper or its own:
// mode). Every call seals: skipping one because a layer of that name exists
// would drop whatever the VM wrote since.
func (m *Manager) Seal(ctx context.Context, h Held, name, message string, mode SealMode) (string, error) {
	if !h.Has {
		return "", fmt.Errorf("seal rootfs of %s: no device", h.Owner)
	}
	base := filepath.Join(h.Dir, name)
	layer := base + ".lsmt"
	for k := 1; fileExists(layer); k++ {
		base = filepath.Join(h.Dir, fmt.Sprintf("%s.%d", name, k))
		layer = base + ".lsmt"
	}
	res, err := m.sd.Restack(ctx, rpc.RestackParams{ID: h.Device, Layer: layer, Message: message, Keep: mode == KeepUpper})
	if err != nil {
		return "", fmt.Errorf("seal rootfs of %s: restack: %w", h.Owner, err)
	}
	layers := res.Layers
	if len(layers) == 0 { // a daemon from before Keep, which always restacks
		layers = res.Device.Layers
	}
	cfg := base + ".json"
	if err := snapshot.WriteImageConfig(cfg, layers); err != nil {
		return "", fmt.Errorf("seal rootfs of %s: %w", h.Owner, err)
	}
	return cfg, nil
}

// SealRoot seals a root disk on image config cfg: it first waits until
// cfg's layers are local files (the config a seal writes lists the
// device's layers: files only, so that uploads and snapshots can read
// them; lazy.go).
func (m *Manager) SealRoot(ctx context.Context, h Held, cfg, name, message string, mode SealMode) (string, error) {
	if err := m.lazy.settle(ctx, cfg); err != nil {
		return "", err
	}
	return m.Seal(ctx, h, name, message, mode)
}

func fileExists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// SealAndDelete (VM stopped) seals h's device into <dir>/<name>.lsmt and
// deletes the device: for build and template VMs, whose disk is committed
// once. It returns the config listing the sealed stack.
func (m *Manager) SealAndDelete(ctx context.Context, h Held, name, message string) (string, error) {
	cfg, err := m.Seal(ctx, h, name, message, KeepUpper)
	if err != nil {
		return "", err
	}
	if err := m.sd.Delete(context.WithoutCancel(ctx), h.Device); err != nil {
		return "", fmt.Errorf("seal rootfs of %s: delete device: %w", h.Owner, err)
	}
	return cfg, nil
}

// CopyInto puts the disk of image config cfg, whose own layers live in
// from, into the snapshot directory dir (shared layers are hard-linked)
// and returns dir's config of it.
func (m *Manager) CopyInto(cfg, from, dir string) (string, error) {
	layers, err := snapshot.LayersOf(cfg)
	if err != nil {
		return "", err
	}
	snapLayers, err := snapshot.AdoptLayers(layers, from, dir)
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, "rootfs.json")
	return out, snapshot.WriteImageConfig(out, snapLayers)
}

// BlankLayer writes base.lsmt, a sealed layer of size bytes that holds no
// data, and base.json, the image config of it (a new blank volume).
func BlankLayer(ctx context.Context, base string, size int64) error {
	raw := base + ".raw"
	f, err := os.OpenFile(raw, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("blank volume: %w", err)
	}
	defer os.Remove(raw)
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("blank volume: %w", err)
	}
	if _, err := storimage.ImportRaw(ctx, raw, base+".lsmt", storimage.CommitOptions{Message: "blank volume"}); err != nil {
		return fmt.Errorf("blank volume: %w", err)
	}
	return snapshot.WriteImageConfig(base+".json", []string{base + ".lsmt"})
}
