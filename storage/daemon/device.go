package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/image"
	"github.com/agentenv/agentenv/storage/nbd"
)

var errNoImage = errors.New("device has no open image")

// swapBackend is the nbd.Backend of a device. Restack swaps the image under
// it while holding the write lock, so in-flight requests finish on the old
// image, new ones wait, and clients stay connected across the swap.
type swapBackend struct {
	mu   sync.RWMutex
	im   *image.Image
	size int64

	// A failed read is an I/O error in the guest; the log says why (a
	// remote lower's error names its URL, which names the layer's digest),
	// at most once every readErrorEvery per device.
	log       *slog.Logger
	id        uint32
	lastError atomic.Int64 // unix nanoseconds of the last logged read error
}

const readErrorEvery = 10 * time.Second

func (b *swapBackend) ReadAt(p []byte, off int64) (int, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.im == nil {
		return 0, errNoImage
	}
	n, err := b.im.ReadAt(p, off)
	if err != nil && n < len(p) && !errors.Is(err, io.EOF) && b.log != nil {
		now, last := time.Now().UnixNano(), b.lastError.Load()
		if now-last >= int64(readErrorEvery) && b.lastError.CompareAndSwap(last, now) {
			b.log.Error("device read failed: the client gets an I/O error", "device", b.id, "offset", off, "length", len(p), "err", err)
		}
	}
	return n, err
}

func (b *swapBackend) WriteAt(p []byte, off int64) (int, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.im == nil {
		return 0, errNoImage
	}
	n, err := b.im.WriteAt(p, off)
	if errors.Is(err, image.ErrReadOnly) {
		err = nbd.ErrReadOnly
	}
	return n, err
}

func (b *swapBackend) Size() int64 { return b.size }

func (b *swapBackend) Flush() error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.im == nil {
		return errNoImage
	}
	return b.im.Flush()
}

func (b *swapBackend) Trim(off, length int64) error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.im == nil {
		return errNoImage
	}
	return b.im.Trim(off, length)
}

func (b *swapBackend) WriteZeroes(off, length int64) error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.im == nil {
		return errNoImage
	}
	return b.im.WriteZeroes(off, length)
}

// Close closes the current image.
func (b *swapBackend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.im == nil {
		return nil
	}
	err := b.im.Close()
	b.im = nil
	return err
}

// device is one live (or lost) export.
type device struct {
	// op serialises restack, delete and holder changes on this device; its
	// holder reads rec freely.
	op sync.Mutex
	// mu guards rec, lost and exp for readers that do not take op (list,
	// which must not wait for a restack); writers hold op and take mu.
	mu  sync.RWMutex
	rec record

	lost    string // non-empty: not exported, and why
	deleted bool   // set under op when removed from the daemon

	be  *swapBackend
	exp Export
	// cancel ends the context the device's first image was opened with
	// (the waits of its lazy reads); stop calls it first.
	cancel context.CancelFunc
}

// set changes the device's state for readers (op held).
func (dv *device) set(f func()) {
	dv.mu.Lock()
	defer dv.mu.Unlock()
	f()
}

func (dv *device) info(d *Daemon) rpc.Device {
	dv.mu.RLock()
	defer dv.mu.RUnlock()
	r := dv.rec
	out := rpc.Device{
		ID: r.ID, Kind: r.Kind, State: rpc.StateActive, Owner: r.Owner, Image: r.Image, Config: r.Config,
		ReadOnly: r.ReadOnly, Size: r.Size, Export: r.Export,
		Holders: append([]string(nil), r.Holders...), Layers: append([]string(nil), r.Layers...),
	}
	if dv.lost != "" || dv.exp == nil {
		out.State, out.LostReason = rpc.StateLost, dv.lost
		return out
	}
	ep := dv.exp.Endpoint()
	out.Socket, out.URI, out.TCP, out.BlockDevice, out.Block = ep.Socket, ep.URI, ep.TCP, ep.BlockDevice, ep.Block
	return out
}

// start opens the device's image and exports it.
func (d *Daemon) start(dv *device) error {
	r := &dv.rec
	// The device's own context ends the waits of its lazy reads (for a
	// restarting aenvd) before stop waits for the reads in flight.
	ctx, cancel := context.WithCancel(d.ctx)
	opts := d.imageOptions(r.ReadOnly)
	if r.Kind == rpc.KindShared {
		// A shared export is a memory stack: its mapping reads around
		// every fault, so the lazy layers' caches read nothing ahead.
		opts.HTTP.ReadAhead = 1
	}
	im, err := image.Open(ctx, r.Config, opts)
	if err != nil {
		cancel()
		return fmt.Errorf("open image of device %d: %w", r.ID, err)
	}
	dv.cancel = cancel
	if r.Size != 0 && im.Size() != r.Size {
		im.Close()
		return fmt.Errorf("device %d: image %s is %d bytes, the device %d", r.ID, r.Config, im.Size(), r.Size)
	}
	r.Size = im.Size()
	dv.be = &swapBackend{im: im, size: im.Size(), log: d.log, id: r.ID}
	dv.exp, err = d.exporter.Export(d.ctx, ExportSpec{
		ID: r.ID, Name: r.Export, Description: r.Image, Backend: dv.be,
		ReadOnly: r.ReadOnly, TCP: r.TCP, Block: r.blockKind(), UblkID: r.UblkID, ConnectAs: r.ConnectAs,
	})
	if err != nil {
		dv.be.Close()
		dv.be = nil
		return err
	}
	if ep := dv.exp.Endpoint(); ep.Block == rpc.BlockUblk {
		id := ep.UblkID
		r.UblkID = &id // saved by the caller with the record
	}
	return nil
}

// stop ends the export (dropping client connections) and closes the image;
// on-disk state is untouched.
func (dv *device) stop() error {
	if dv.cancel != nil {
		dv.cancel()
		dv.cancel = nil
	}
	if dv.exp != nil {
		dv.exp.Stop()
		dv.set(func() { dv.exp = nil })
	}
	if dv.be == nil {
		return nil
	}
	return dv.be.Close()
}
