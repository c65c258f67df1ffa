//go:build linux

package ublk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ControlPath is the ublk driver's control node.
const ControlPath = "/dev/ublk-control"

// Available returns nil when the ublk driver is loaded, or why not.
func Available() error {
	if _, err := os.Stat(ControlPath); err != nil {
		return fmt.Errorf("ublk driver not loaded (modprobe ublk_drv): %w", err)
	}
	return nil
}

// control issues control commands over /dev/ublk-control. Each command
// waits for its completion; START_DEV and END_USER_RECOVERY block until
// every queue has fetched, so they run while the queues are already up.
type control struct {
	fd  int
	r   *ring
	buf []byte // one page outside the Go heap: the kernel reads and writes it asynchronously
}

func openControl() (*control, error) {
	fd, err := unix.Open(ControlPath, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", ControlPath, err)
	}
	r, err := newRing(4)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	buf, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		r.close()
		unix.Close(fd)
		return nil, fmt.Errorf("ublk control buffer: %w", err)
	}
	return &control{fd: fd, r: r, buf: buf}, nil
}

func (c *control) close() {
	c.r.close()
	unix.Close(c.fd)
	unix.Munmap(c.buf)
}

// cmd issues op for device id with c.buf[:n] as its buffer (n may be 0)
// and data as its inline argument, and returns the command's result.
func (c *control) cmd(op uint32, id uint32, n int, data uint64) (int32, error) {
	cc := ctrlCmd{devID: id, queueID: 0xffff, data: data}
	if n > 0 {
		cc.addr, cc.len = uint64(uintptr(unsafe.Pointer(&c.buf[0]))), uint16(n)
	}
	payload := unsafe.Slice((*byte)(unsafe.Pointer(&cc)), unsafe.Sizeof(cc))
	if !c.r.queueCmd(c.fd, op, 0, payload) {
		return 0, errors.New("ublk control: submission queue full")
	}
	var res int32
	for got := 0; got == 0; {
		if err := c.r.enter(1); err != nil {
			return 0, fmt.Errorf("ublk control: %w", err)
		}
		got = c.r.reap(func(_ uint64, r int32) { res = r })
	}
	return res, nil
}

// errno turns a negative command result into an error naming the command.
func errno(what string, id uint32, res int32) error {
	if res >= 0 {
		return nil
	}
	return fmt.Errorf("ublk %s (device %d): %w", what, id, unix.Errno(-res))
}

func (c *control) info() *devInfo { return (*devInfo)(unsafe.Pointer(&c.buf[0])) }

// addDev creates a device; the kernel picks its id and returns the info.
func (c *control) addDev(want devInfo) (devInfo, error) {
	*c.info() = want
	res, err := c.cmd(cmdAddDev, ^uint32(0), int(unsafe.Sizeof(want)), 0)
	if err == nil {
		err = errno("ADD_DEV", ^uint32(0), res)
	}
	return *c.info(), err
}

func (c *control) getInfo(id uint32) (devInfo, error) {
	*c.info() = devInfo{}
	res, err := c.cmd(cmdGetDevInfo, id, int(unsafe.Sizeof(devInfo{})), 0)
	if err == nil {
		err = errno("GET_DEV_INFO", id, res)
	}
	return *c.info(), err
}

func (c *control) setParams(id uint32, p params) error {
	p.len = uint32(unsafe.Offsetof(p.reserved0) + unsafe.Sizeof(p.reserved0))
	*(*params)(unsafe.Pointer(&c.buf[0])) = p
	res, err := c.cmd(cmdSetParams, id, int(p.len), 0)
	if err == nil {
		err = errno("SET_PARAMS", id, res)
	}
	return err
}

// simple issues a command that takes only the device id and data.
func (c *control) simple(op uint32, what string, id uint32, data uint64) error {
	res, err := c.cmd(op, id, 0, data)
	if err == nil {
		err = errno(what, id, res)
	}
	return err
}

// Features returns the UBLK_F_* flags the driver supports (GET_FEATURES).
func Features(ctx context.Context) (uint64, error) {
	c, err := openControl()
	if err != nil {
		return 0, err
	}
	defer c.close()
	res, err := c.cmd(cmdGetFeatures, 0, 8, 0)
	if err == nil {
		err = errno("GET_FEATURES", 0, res)
	}
	return *(*uint64)(unsafe.Pointer(&c.buf[0])), err
}

// State is a device's state as the driver reports it.
type State int

// The states of GET_DEV_INFO.
const (
	StateDead     State = stateDead
	StateLive     State = stateLive
	StateQuiesced State = stateQuiesced // its server died; a new one may recover it
)

func (s State) String() string {
	switch s {
	case StateDead:
		return "dead"
	case StateLive:
		return "live"
	case StateQuiesced:
		return "quiesced"
	}
	return fmt.Sprintf("state(%d)", int(s))
}

// Info is what GET_DEV_INFO says about a device.
type Info struct {
	ID         uint32
	State      State
	Queues     int
	Depth      int
	MaxIOBytes int
	ServerPID  int
	Flags      uint64
}

// DeviceInfo queries the driver about device id.
func DeviceInfo(ctx context.Context, id uint32) (Info, error) {
	c, err := openControl()
	if err != nil {
		return Info{}, err
	}
	defer c.close()
	di, err := c.getInfo(id)
	if err != nil {
		return Info{}, err
	}
	return Info{ID: di.devID, State: State(di.state), Queues: int(di.nrHWQueues), Depth: int(di.queueDepth),
		MaxIOBytes: int(di.maxIOBufSize), ServerPID: int(di.serverPID), Flags: di.flags}, nil
}
