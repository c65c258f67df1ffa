package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
)

// A delete stops the export (after-stop), then moves the device directory
// into STATE/trash in one durable rename (after-unlink): from that rename on
// the device is gone for a restarted daemon too, which empties the trash at
// startup. Only then are the files removed and the id freed. Sealed layers
// written to a path of the caller's (RestackParams.Layer) are the caller's
// and stay.

func (d *Daemon) trashDir() string { return filepath.Join(d.opts.StateDir, "trash") }

// delete stops a device's export and removes its state. Shared devices go
// only through release (internal), so a stray delete cannot pull a memory
// image from under running VMs.
func (d *Daemon) delete(_ context.Context, id uint32, internal bool) error {
	dv, err := d.lockDevice(id)
	if err != nil {
		return err
	}
	defer dv.op.Unlock()
	if dv.rec.Kind == rpc.KindShared && !internal && dv.lost == "" {
		return errf(rpc.CodeConflict, "device %d is shared by %v: release it instead", id, dv.rec.Holders)
	}
	if err := dv.stop(); err != nil {
		d.log.Warn("delete: close image", "device", id, "err", err)
	}
	if err := fpDeleteAfterStop.Inject(); err != nil {
		return d.deleteFailed(dv, err)
	}
	trash := filepath.Join(d.trashDir(), fmt.Sprintf("%d-%s", id, nonce()))
	if err := atomicfile.Rename(d.deviceDir(id), trash); err != nil {
		return d.deleteFailed(dv, err)
	}
	dv.deleted = true
	d.mu.Lock()
	delete(d.devices, id)
	if d.shared[dv.rec.Image] == id && dv.rec.Kind == rpc.KindShared {
		delete(d.shared, dv.rec.Image)
	}
	d.mu.Unlock()
	d.pool.forget(id)
	os.Remove(d.socketPath(id))
	if err := fpDeleteAfterUnlink.Inject(); err != nil {
		return fmt.Errorf("delete device %d: %w", id, err) // the trash is emptied at the next start
	}
	if err := os.RemoveAll(trash); err != nil {
		d.log.Warn("delete: empty trash (retried at the next start)", "device", id, "err", err)
	}
	d.ids.free(id)
	d.log.Info("device deleted", "device", id)
	return nil
}

// deleteFailed leaves a device whose export is stopped but whose state is
// in place marked lost (it can be deleted again; a restart re-exports it).
func (d *Daemon) deleteFailed(dv *device, err error) error {
	dv.set(func() { dv.lost = "delete failed: " + err.Error() })
	return fmt.Errorf("delete device %d: %w", dv.rec.ID, err)
}

// discard removes a device directory that was never handed out: renamed
// into the trash first, so a crash cannot leave half a directory whose
// record survived.
func (d *Daemon) discard(dir string) {
	trash := filepath.Join(d.trashDir(), filepath.Base(dir)+"-"+nonce())
	if err := atomicfile.Rename(dir, trash); err != nil {
		if !os.IsNotExist(err) {
			d.log.Warn("discard device directory", "path", dir, "err", err)
		}
		os.RemoveAll(dir)
		return
	}
	os.RemoveAll(trash)
}

// emptyTrash removes what deletes left in the trash (at startup).
func (d *Daemon) emptyTrash() error {
	entries, err := os.ReadDir(d.trashDir())
	if err != nil {
		return err
	}
	for _, e := range entries {
		p := filepath.Join(d.trashDir(), e.Name())
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("empty trash: %w", err)
		}
		d.log.Info("removed a deleted device's files", "path", p)
	}
	return nil
}

// ownedBy says whether a holder name belongs to owner ("owner" or "owner/...").
func ownedBy(holder, owner string) bool {
	return holder == owner || strings.HasPrefix(holder, owner+"/")
}

// reclaim deletes an owner's runtime devices and drops its shared references,
// except for the devices it still uses. Each deletion and release is its own
// durable step, so a reclaim cut short is finished by calling it again.
func (d *Daemon) reclaim(ctx context.Context, p rpc.ReclaimParams) (rpc.ReclaimResult, error) {
	if p.Owner == "" {
		return rpc.ReclaimResult{}, errf(rpc.CodeInvalid, "owner is required")
	}
	var res rpc.ReclaimResult
	for _, dev := range d.list().Devices {
		if slices.Contains(p.Keep, dev.ID) {
			continue
		}
		switch {
		case dev.Kind == rpc.KindRuntime && dev.Owner == p.Owner:
			if err := d.delete(ctx, dev.ID, false); err != nil {
				return res, err
			}
			res.Deleted = append(res.Deleted, dev.ID)
			if err := fpReclaimAfterDelete.Inject(); err != nil {
				return res, err
			}
		case dev.Kind == rpc.KindShared:
			released := false
			for _, h := range dev.Holders {
				if ownedBy(h, p.Owner) {
					if err := d.release(ctx, rpc.ReleaseParams{ID: dev.ID, Holder: h}); err != nil {
						return res, err
					}
					released = true
				}
			}
			if released {
				res.Released = append(res.Released, dev.ID)
				if err := fpReclaimAfterRelease.Inject(); err != nil {
					return res, err
				}
			}
		}
	}
	return res, nil
}
