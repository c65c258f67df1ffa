package daemon

import (
	"context"
	"fmt"

	"github.com/agentenv/agentenv/storage/daemon/rpc"
)

// assign hands a runtime device to another owner: one durable record save,
// so after a crash the device is either still the old owner's or the new
// one's.
func (d *Daemon) assign(_ context.Context, p rpc.AssignParams) (rpc.Device, error) {
	if p.Owner == "" {
		return rpc.Device{}, errf(rpc.CodeInvalid, "owner is required")
	}
	dv, err := d.lockDevice(p.ID)
	if err != nil {
		return rpc.Device{}, err
	}
	defer dv.op.Unlock()
	if dv.rec.Kind != rpc.KindRuntime || dv.lost != "" {
		return rpc.Device{}, errf(rpc.CodeConflict, "device %d (%s, lost %q): only a servable runtime device changes owner", p.ID, dv.rec.Kind, dv.lost)
	}
	next := dv.rec
	next.Owner = p.Owner
	if err := d.save(&next); err != nil {
		return rpc.Device{}, fmt.Errorf("assign device %d to %s: %w", p.ID, p.Owner, err)
	}
	dv.set(func() { dv.rec = next })
	d.log.Info("device assigned", "device", p.ID, "owner", p.Owner)
	return dv.info(d), nil
}
