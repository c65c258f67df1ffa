package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"

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
}

func (b *swapBackend) ReadAt(p []byte, off int64) (int, error) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.im == nil {
		return 0, errNoImage
	}
	return b.im.ReadAt(p, off)
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
	// op serialises restack, delete and holder changes on this device.
	op  sync.Mutex
	rec record

	lost    string // non-empty: not exported, and why
	deleted bool   // set under op when removed from the daemon

	be      *swapBackend
	srv     *nbd.Server
	lns     []net.Listener
	cancel  context.CancelFunc
	served  sync.WaitGroup
	tcpAddr string
	kdev    *nbd.KernelDevice
}

func (dv *device) info(d *Daemon) rpc.Device {
	r := dv.rec
	out := rpc.Device{
		ID: r.ID, Kind: r.Kind, State: rpc.StateActive, Owner: r.Owner, Image: r.Image, Config: r.Config,
		ReadOnly: r.ReadOnly, Size: r.Size, Export: r.Export, TCP: dv.tcpAddr,
		Holders: append([]string(nil), r.Holders...), Layers: append([]string(nil), r.Layers...),
	}
	if dv.lost != "" {
		out.State, out.LostReason = rpc.StateLost, dv.lost
		return out
	}
	out.Socket = d.socketPath(r.ID)
	if dv.kdev != nil {
		out.BlockDevice = dv.kdev.Path
	}
	out.URI = "nbd+unix:///" + r.Export + "?socket=" + out.Socket
	return out
}

// start opens the device's image and exports it.
func (d *Daemon) start(dv *device) error {
	r := &dv.rec
	im, err := image.Open(d.ctx, r.Config, image.Options{ReadOnly: r.ReadOnly})
	if err != nil {
		return fmt.Errorf("open image of device %d: %w", r.ID, err)
	}
	if r.Size != 0 && im.Size() != r.Size {
		im.Close()
		return fmt.Errorf("device %d: image %s is %d bytes, the device %d", r.ID, r.Config, im.Size(), r.Size)
	}
	r.Size = im.Size()
	dv.be = &swapBackend{im: im, size: im.Size()}
	dv.srv = nbd.NewServer(d.opts.NBD)
	if err := dv.srv.Add(nbd.Export{Name: r.Export, Description: r.Image, Backend: dv.be, ReadOnly: r.ReadOnly}); err != nil {
		dv.be.Close()
		return err
	}
	if err := d.listen(dv); err != nil {
		dv.stop()
		return err
	}
	if r.Kernel {
		// Two connections: the kernel spreads requests over them.
		kd, err := nbd.AttachKernel(d.ctx, dv.srv, r.Export, 2)
		if err != nil {
			dv.stop()
			return err
		}
		dv.kdev = kd
	}
	return nil
}

// listen opens the device's Unix socket (and loopback TCP port) and serves them.
func (d *Daemon) listen(dv *device) error {
	sock := d.socketPath(dv.rec.ID)
	os.Remove(sock) // a socket file left by a dead daemon
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("export device %d on %s: %w", dv.rec.ID, sock, err)
	}
	dv.lns = append(dv.lns, ln)
	if dv.rec.TCP {
		if err := dv.listenTCP(); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithCancel(d.ctx)
	dv.cancel = cancel
	for _, l := range dv.lns {
		dv.served.Add(1)
		go func() {
			defer dv.served.Done()
			if err := dv.srv.Serve(ctx, l); err != nil {
				d.log.Warn("nbd export stopped", "device", dv.rec.ID, "err", err)
			}
		}()
	}
	return nil
}

func (dv *device) listenTCP() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("export device %d on loopback tcp: %w", dv.rec.ID, err)
	}
	dv.lns = append(dv.lns, ln)
	dv.tcpAddr = ln.Addr().String()
	return nil
}

// stop ends the export (dropping client connections) and closes the image;
// on-disk state is untouched.
func (dv *device) stop() error {
	if dv.kdev != nil {
		// Detach first, so the kernel flushes while the export still answers.
		dv.kdev.Detach()
		dv.kdev = nil
	}
	if dv.cancel != nil {
		dv.cancel()
	}
	for _, l := range dv.lns {
		l.Close()
	}
	dv.served.Wait()
	if dv.srv != nil {
		dv.srv.Close()
	}
	dv.lns, dv.cancel = nil, nil
	if dv.be == nil {
		return nil
	}
	return dv.be.Close()
}
