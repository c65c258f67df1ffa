package daemon

import (
	"context"

	"github.com/agentenv/agentenv/storage/daemon/rpc"
)

// Local is the daemon used in process, with the method set of the RPC
// client (*client.Client), so both implement client.Devices and code above
// can run on either. Errors are the same *rpc.Error values the RPC carries
// (errors.Is with rpc.ErrNotFound, ...). Calls wait until Run has recovered
// the state directory.
type Local struct{ d *Daemon }

// Local returns the in-process interface of the daemon; Run must be running.
func (d *Daemon) Local() *Local { return &Local{d: d} }

// do runs op once the daemon is ready, with the RPC's error vocabulary.
func do[R any](ctx context.Context, l *Local, op func(context.Context) (R, error)) (R, error) {
	var zero R
	select {
	case <-l.d.readyCh:
	case <-l.d.stopCh:
	case <-ctx.Done():
		return zero, ctx.Err()
	}
	select {
	case <-l.d.stopCh:
		return zero, errf(rpc.CodeShuttingDown, "daemon is shutting down")
	default:
	}
	r, err := op(ctx)
	if err != nil {
		return zero, toRPCError(err)
	}
	return r, nil
}

func noResult(fn func(context.Context) error) func(context.Context) (struct{}, error) {
	return func(ctx context.Context) (struct{}, error) { return struct{}{}, fn(ctx) }
}

// Create makes a runtime device from an image config.
func (l *Local) Create(ctx context.Context, p rpc.CreateParams) (rpc.Device, error) {
	return do(ctx, l, func(ctx context.Context) (rpc.Device, error) { return l.d.create(ctx, p) })
}

// Delete removes a device and its state.
func (l *Local) Delete(ctx context.Context, id uint32) error {
	_, err := do(ctx, l, noResult(func(ctx context.Context) error { return l.d.delete(ctx, id, false) }))
	return err
}

// Restack seals a device's upper into a new layer and continues on a fresh upper.
func (l *Local) Restack(ctx context.Context, p rpc.RestackParams) (rpc.RestackResult, error) {
	return do(ctx, l, func(ctx context.Context) (rpc.RestackResult, error) { return l.d.restack(ctx, p) })
}

// Localize moves a device's URL lowers onto local copies (rpc.LocalizeParams).
func (l *Local) Localize(ctx context.Context, p rpc.LocalizeParams) (rpc.Device, error) {
	return do(ctx, l, func(ctx context.Context) (rpc.Device, error) { return l.d.localize(ctx, p) })
}

// AcquireShared references the shared read-only device of an image.
func (l *Local) AcquireShared(ctx context.Context, imageConfig, holder string) (rpc.Device, error) {
	return l.Acquire(ctx, rpc.AcquireParams{Image: imageConfig, Holder: holder})
}

// Acquire is AcquireShared with every option.
func (l *Local) Acquire(ctx context.Context, p rpc.AcquireParams) (rpc.Device, error) {
	return do(ctx, l, func(ctx context.Context) (rpc.Device, error) { return l.d.acquire(ctx, p) })
}

// Prefetch pushes ranges of a shared FUSE file into the page cache.
func (l *Local) Prefetch(ctx context.Context, p rpc.PrefetchParams) (rpc.PrefetchResult, error) {
	return do(ctx, l, func(ctx context.Context) (rpc.PrefetchResult, error) { return l.d.prefetch(ctx, p) })
}

// ReleaseShared drops a holder's reference.
func (l *Local) ReleaseShared(ctx context.Context, id uint32, holder string) error {
	_, err := do(ctx, l, noResult(func(ctx context.Context) error {
		return l.d.release(ctx, rpc.ReleaseParams{ID: id, Holder: holder})
	}))
	return err
}

// List returns every device, lost ones included.
func (l *Local) List(ctx context.Context) ([]rpc.Device, error) {
	return do(ctx, l, func(context.Context) ([]rpc.Device, error) { return l.d.list().Devices, nil })
}

// Reclaim deletes an owner's devices and references except those kept.
func (l *Local) Reclaim(ctx context.Context, owner string, keep ...uint32) (rpc.ReclaimResult, error) {
	return do(ctx, l, func(ctx context.Context) (rpc.ReclaimResult, error) {
		return l.d.reclaim(ctx, rpc.ReclaimParams{Owner: owner, Keep: keep})
	})
}

// Assign hands a runtime device to another owner.
func (l *Local) Assign(ctx context.Context, p rpc.AssignParams) (rpc.Device, error) {
	return do(ctx, l, func(ctx context.Context) (rpc.Device, error) { return l.d.assign(ctx, p) })
}

// Rebase moves a device never written onto another image's lowers.
func (l *Local) Rebase(ctx context.Context, p rpc.RebaseParams) (rpc.Device, error) {
	return do(ctx, l, func(ctx context.Context) (rpc.Device, error) { return l.d.rebase(ctx, p) })
}

// Warm registers an image shape with the warm pool.
func (l *Local) Warm(ctx context.Context, p rpc.WarmParams) error {
	_, err := do(ctx, l, noResult(func(context.Context) error { return l.d.warm(p) }))
	return err
}

// Features reports what the daemon supports.
func (l *Local) Features(ctx context.Context) (rpc.Features, error) {
	return do(ctx, l, func(context.Context) (rpc.Features, error) { return l.d.features(), nil })
}

// Socket is the RPC socket path ("" when the daemon serves in process only).
func (d *Daemon) Socket() string { return d.opts.Socket }
