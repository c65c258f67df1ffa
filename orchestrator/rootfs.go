package orchestrator

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/storage/daemon/client"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
)

// Image configs and seals of storage-daemon disks (see disks.go).

// sealMode says what a seal leaves the device on.
type sealMode bool

const (
	// restackUpper: a fresh upper stacked on the sealed layer, for a VM
	// that runs on (a snapshot of a running sandbox).
	restackUpper sealMode = false
	// keepUpper: its own upper, unchanged, for a device deleted next (a
	// pause, a kill, a build's commit), whose VM can still run on from
	// where it was if what follows the seal fails. It spares the daemon a
	// new generation to write and open (rpc.RestackParams.Keep).
	keepUpper sealMode = true
)

// sealDevice seals rec's device's upper into a new layer <dir>/<name>.lsmt
// (<name>.<k>.lsmt when a seal of the same generation exists already: a
// pause that failed after its seal and was retried, or a recovery) and
// writes the config listing the stack the sealed layer completes next to
// it: the daemon's list is the truth. It returns that config.
// The device stays (on a fresh upper or its own: mode). Every call seals:
// skipping one because a layer of that name exists would drop whatever the
// VM wrote since.
func sealDevice(ctx context.Context, sd client.Devices, rec Record, name, message string, mode sealMode) (string, error) {
	if !rec.HasDevice {
		return "", fmt.Errorf("seal rootfs of %s: no device", rec.ID)
	}
	base := filepath.Join(rec.Dir, name)
	layer := base + ".lsmt"
	for k := 1; fileExists(layer); k++ {
		base = filepath.Join(rec.Dir, fmt.Sprintf("%s.%d", name, k))
		layer = base + ".lsmt"
	}
	res, err := sd.Restack(ctx, rpc.RestackParams{ID: rec.Device, Layer: layer, Message: message, Keep: mode == keepUpper})
	if err != nil {
		return "", fmt.Errorf("seal rootfs of %s: restack: %w", rec.ID, err)
	}
	layers := res.Layers
	if len(layers) == 0 { // a daemon from before Keep, which always restacks
		layers = res.Device.Layers
	}
	cfg := base + ".json"
	if err := snapshot.WriteImageConfig(cfg, layers); err != nil {
		return "", fmt.Errorf("seal rootfs of %s: %w", rec.ID, err)
	}
	return cfg, nil
}

func fileExists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}

// sealAndDelete (VM stopped) seals rec's device into
// <dir>/rootfs-<gen>.lsmt, points rec at the config listing it and deletes
// the device: for build and template VMs, whose disk is committed once.
func sealAndDelete(ctx context.Context, sd client.Devices, rec *Record) error {
	cfg, err := sealDevice(ctx, sd, *rec, fmt.Sprintf("rootfs-%d", rec.Gen), "sandbox "+rec.ID, keepUpper)
	if err != nil {
		return err
	}
	if err := sd.Delete(context.WithoutCancel(ctx), rec.Device); err != nil {
		return fmt.Errorf("seal rootfs of %s: delete device: %w", rec.ID, err)
	}
	rec.RootfsImage, rec.Device, rec.HasDevice = cfg, 0, false
	return nil
}
