//go:build linux

// Package ublk serves block devices (/dev/ublkbN) through the Linux ublk
// driver from user space in pure Go: control commands (ADD_DEV, SET_PARAMS,
// START_DEV, STOP_DEV, DEL_DEV, GET_DEV_INFO, START/END_USER_RECOVERY) go
// to /dev/ublk-control and each queue's I/O is fetched and committed with
// FETCH_REQ / COMMIT_AND_FETCH_REQ, all as io_uring URING_CMDs with
// 128-byte entries (the ioctl-encoded command numbers; a ring of this
// package's own, see ring.go). Any Backend (a stacked image from
// storage/image, a file) serves read, write, flush, discard and
// write-zeroes, through plain per-tag buffers.
//
// With Options.Recovery a device outlives its server: when the process
// dies the driver quiesces the device instead of removing it, and Recover
// in a new process re-attaches, after which the requests the dead server
// had taken are reissued to the new one (UBLK_F_USER_RECOVERY with
// UBLK_F_USER_RECOVERY_REISSUE).
//
// It is written here because no well-kept Go library for ublk is served to
// this project (the one Go implementation available is experimental). The
// facts come from the kernel's Documentation/block/ublk.rst and
// include/uapi/linux/ublk_cmd.h.
package ublk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Backend is what a device serves. storage/image's Image and storage/nbd's
// backends fit as they are. Reads and writes come concurrently.
type Backend interface {
	io.ReaderAt
	io.WriterAt
	Size() int64
	Flush() error
	Trim(off, length int64) error
}

// Zeroer is an optional Backend extension for write-zeroes (else Trim,
// which must then read back as zeroes, serves it).
type Zeroer interface {
	WriteZeroes(off, length int64) error
}

// Options configure a device.
type Options struct {
	Queues     int  // hardware queues; default 1
	Depth      int  // tags per queue; default 64
	MaxIOBytes int  // largest request; default 512 KiB
	ReadOnly   bool // the device refuses writes (BLKROSET cannot undo it)
	// Recovery keeps the device when its server dies, for Recover.
	Recovery bool
	Log      *slog.Logger
}

func (o *Options) defaults() {
	if o.Queues <= 0 {
		o.Queues = 1
	}
	if o.Depth <= 0 {
		o.Depth = 64
	}
	o.Depth = min(o.Depth, maxQueueDepth)
	if o.MaxIOBytes <= 0 {
		o.MaxIOBytes = 512 << 10
	}
	o.MaxIOBytes = (o.MaxIOBytes + 4095) &^ 4095
	if o.Log == nil {
		o.Log = slog.Default()
	}
}

// Device is a ublk device served by this process.
type Device struct {
	ID   uint32
	Path string // /dev/ublkbN

	opts    Options
	charFd  int
	maps    [][]byte
	wg      sync.WaitGroup
	errMu   sync.Mutex
	errs    []error
	closeMu sync.Mutex
	closed  bool
}

// Create adds a device of b.Size() bytes served from b and starts it; on
// return Path is ready for I/O.
func Create(ctx context.Context, b Backend, o Options) (*Device, error) {
	o.defaults()
	if b.Size() <= 0 || b.Size()%512 != 0 {
		return nil, fmt.Errorf("ublk create: backend size %d is not a positive multiple of 512", b.Size())
	}
	c, err := openControl()
	if err != nil {
		return nil, err
	}
	defer c.close()
	flags := uint64(flagCmdIoctlEncode)
	if o.Recovery {
		flags |= flagUserRecovery | flagUserRecoveryReissue
	}
	di, err := c.addDev(devInfo{nrHWQueues: uint16(o.Queues), queueDepth: uint16(o.Depth),
		maxIOBufSize: uint32(o.MaxIOBytes), devID: ^uint32(0), flags: flags})
	if err != nil {
		return nil, err
	}
	d := &Device{ID: di.devID, Path: fmt.Sprintf("/dev/ublkb%d", di.devID), opts: o, charFd: -1}
	if err := c.setParams(d.ID, deviceParams(b.Size(), o)); err != nil {
		d.remove(c)
		return nil, err
	}
	if err := d.startQueues(b); err != nil {
		d.remove(c)
		return nil, err
	}
	if err := c.simple(cmdStartDev, "START_DEV", d.ID, uint64(os.Getpid())); err != nil {
		d.remove(c)
		return nil, err
	}
	return d, nil
}

func deviceParams(size int64, o Options) params {
	p := params{types: paramBasic | paramDiscard,
		attrs: attrVolatileCache, logicalBSShift: 9, physicalBSShift: 12, ioOptShift: 12, ioMinShift: 9,
		maxSectors: uint32(o.MaxIOBytes >> 9), devSectors: uint64(size >> 9)}
	if o.ReadOnly {
		p.attrs |= attrReadOnly
		p.types = paramBasic
		return p
	}
	p.discardGranularity, p.maxDiscardSectors, p.maxWriteZeroesSectors, p.maxDiscardSegments = 4096, 1<<22, 1<<22, 1
	return p
}

// Recover re-attaches to device id, left quiesced by a server that died,
// serving it from b; requests the old server had taken are reissued. The
// queue count and depth are the device's own.
func Recover(ctx context.Context, id uint32, b Backend, o Options) (*Device, error) {
	o.defaults()
	c, err := openControl()
	if err != nil {
		return nil, err
	}
	defer c.close()
	di, err := waitQuiesced(ctx, c, id)
	if err != nil {
		return nil, err
	}
	o.Queues, o.Depth, o.MaxIOBytes, o.Recovery = int(di.nrHWQueues), int(di.queueDepth), int(di.maxIOBufSize), true
	if err := c.simple(cmdStartUserRecovery, "START_USER_RECOVERY", id, 0); err != nil {
		return nil, err
	}
	d := &Device{ID: id, Path: fmt.Sprintf("/dev/ublkb%d", id), opts: o, charFd: -1}
	if err := d.startQueues(b); err != nil {
		d.release()
		return nil, err
	}
	if err := c.simple(cmdEndUserRecovery, "END_USER_RECOVERY", id, uint64(os.Getpid())); err != nil {
		d.release()
		return nil, err
	}
	return d, nil
}

// waitQuiesced waits until the driver has noticed the old server's death
// (it quiesces the device from the old process's teardown, asynchronously)
// and released its char device.
func waitQuiesced(ctx context.Context, c *control, id uint32) (devInfo, error) {
	for {
		di, err := c.getInfo(id)
		if err != nil {
			return di, err
		}
		if di.flags&flagUserRecovery == 0 {
			return di, fmt.Errorf("ublk recover device %d: created without user recovery", id)
		}
		if di.state == stateQuiesced {
			return di, nil
		}
		select {
		case <-ctx.Done():
			return di, fmt.Errorf("ublk recover device %d: still %v: %w", id, State(di.state), ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// startQueues opens the char device, maps each queue's descriptors and
// starts its server; it returns once every tag is fetched.
func (d *Device) startQueues(b Backend) error {
	path := fmt.Sprintf("/dev/ublkc%d", d.ID)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("ublk open %s: %w", path, err)
	}
	d.charFd = fd
	page := os.Getpagesize()
	stride := (maxQueueDepth*24 + page - 1) / page * page
	size := (d.opts.Depth*24 + page - 1) / page * page
	fetched := make(chan error, d.opts.Queues)
	for qid := range d.opts.Queues {
		descs, err := unix.Mmap(fd, int64(qid*stride), size, unix.PROT_READ, unix.MAP_SHARED|unix.MAP_POPULATE)
		if err != nil {
			return fmt.Errorf("ublk map queue %d of %s: %w", qid, path, err)
		}
		bufs, err := unix.Mmap(-1, 0, d.opts.Depth*d.opts.MaxIOBytes, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		if err != nil {
			unix.Munmap(descs)
			return fmt.Errorf("ublk buffers of queue %d: %w", qid, err)
		}
		d.maps = append(d.maps, descs, bufs)
		q := &queue{id: uint16(qid), depth: d.opts.Depth, charFd: fd, descs: descs, bufs: bufs,
			maxIO: d.opts.MaxIOBytes, backend: b, log: d.opts.Log}
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			if err := q.run(fetched); err != nil {
				d.errMu.Lock()
				d.errs = append(d.errs, err)
				d.errMu.Unlock()
			}
		}()
	}
	for range d.opts.Queues {
		if err := <-fetched; err != nil {
			return err
		}
	}
	return nil
}

// Close stops and deletes the device: I/O in flight completes or fails,
// /dev/ublkbN goes away, and the queues' goroutines are waited for. The
// deletion (DEL_DEV) waits until every process that still has /dev/ublkbN
// open closes it.
func (d *Device) Close() error {
	d.closeMu.Lock()
	defer d.closeMu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	c, err := openControl()
	if err != nil {
		return err
	}
	defer c.close()
	return d.remove(c)
}

// remove stops the device (which aborts every fetched tag, so the queues
// end), releases the char device and deletes the device.
func (d *Device) remove(c *control) error {
	err := c.simple(cmdStopDev, "STOP_DEV", d.ID, 0)
	d.release()
	// DEL_DEV waits until nothing holds the char device: after release.
	err = errors.Join(err, c.simple(cmdDelDev, "DEL_DEV", d.ID, 0))
	d.errMu.Lock()
	defer d.errMu.Unlock()
	return errors.Join(append([]error{err}, d.errs...)...)
}

// release waits for the queues and drops the mappings and the char device.
func (d *Device) release() {
	if d.charFd >= 0 {
		d.wg.Wait()
	}
	for _, m := range d.maps {
		unix.Munmap(m)
	}
	d.maps = nil
	if d.charFd >= 0 {
		unix.Close(d.charFd)
		d.charFd = -1
	}
}
