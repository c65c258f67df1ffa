// Package client is the Go client of aenv-storaged, used by aenvd: one Unix
// socket connection carrying length-prefixed JSON calls (package rpc),
// multiplexed on the request ids: any number of calls are in flight at once
// and each is answered when the daemon finishes it, so a slow restack does
// not hold up a create. A connection the daemon closed (a restart) is
// redialled by the next call.
//
// Errors carry the daemon's codes: match them with errors.Is against
// rpc.ErrNotFound, rpc.ErrConflict, rpc.ErrCapacity, rpc.ErrInvalid and
// rpc.ErrInternal. A call that fails on the way (a dropped connection, a
// cancelled context) returns that error instead; whether the daemon ran it
// is then unknown, and every call is safe to repeat (delete of a deleted
// device is ErrNotFound; a repeated create leaves an extra device of the
// same owner for Reclaim).
//
// Devices is the interface the node's sandbox code uses; *Client
// implements it over RPC and daemon.Local in process.
package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sync"

	"github.com/agentenv/agentenv/storage/daemon/rpc"
)

// Client talks to one daemon. It is safe for concurrent use.
type Client struct {
	socket string

	mu   sync.Mutex // guards conn and next
	conn *conn
	next uint64
}

// conn is one connection and its outstanding calls.
type conn struct {
	nc  net.Conn
	wmu sync.Mutex // one frame at a time

	mu      sync.Mutex
	pending map[uint64]chan rpc.Response
	err     error         // why the connection broke; set once
	done    chan struct{} // closed when it broke
}

// Dial connects to the daemon's RPC socket.
func Dial(ctx context.Context, socket string) (*Client, error) {
	c := &Client{socket: socket}
	if _, err := c.getConn(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// getConn returns the live connection, dialling one if there is none or the
// last one broke.
func (c *Client) getConn(ctx context.Context) (*conn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil && !c.conn.broken() {
		return c.conn, nil
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", c.socket)
	if err != nil {
		return nil, fmt.Errorf("storaged dial %s: %w", c.socket, err)
	}
	cn := &conn{nc: nc, pending: make(map[uint64]chan rpc.Response), done: make(chan struct{})}
	go cn.read()
	c.conn = cn
	return cn, nil
}

func (c *Client) nextID() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.next++
	return c.next
}

// Close closes the connection; calls in flight fail. Devices are not affected.
func (c *Client) Close() error {
	c.mu.Lock()
	cn := c.conn
	c.conn = nil
	c.mu.Unlock()
	if cn == nil {
		return nil
	}
	cn.fail(net.ErrClosed)
	return nil
}

// read delivers responses to their calls until the connection breaks.
func (cn *conn) read() {
	for {
		var resp rpc.Response
		if err := rpc.ReadFrame(cn.nc, &resp); err != nil {
			cn.fail(err)
			return
		}
		cn.mu.Lock()
		ch, ok := cn.pending[resp.ID]
		delete(cn.pending, resp.ID)
		cn.mu.Unlock()
		if ok {
			ch <- resp // buffered: never blocks
		}
		// Unknown ids are answers to calls whose context ended: dropped.
	}
}

func (cn *conn) fail(err error) {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.err != nil {
		return
	}
	cn.err = err
	close(cn.done)
	cn.nc.Close()
}

func (cn *conn) broken() bool {
	select {
	case <-cn.done:
		return true
	default:
		return false
	}
}

// register adds a pending call, or fails if the connection broke.
func (cn *conn) register(id uint64) (chan rpc.Response, error) {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	if cn.err != nil {
		return nil, cn.err
	}
	ch := make(chan rpc.Response, 1)
	cn.pending[id] = ch
	return ch, nil
}

func (cn *conn) unregister(id uint64) {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	delete(cn.pending, id)
}

func (cn *conn) write(ctx context.Context, req rpc.Request) error {
	cn.wmu.Lock()
	defer cn.wmu.Unlock()
	dl, _ := ctx.Deadline()
	cn.nc.SetWriteDeadline(dl)
	if err := rpc.WriteFrame(cn.nc, req); err != nil {
		cn.fail(err)
		return err
	}
	return nil
}

// Call performs one RPC. A connection found broken when the request is
// written is redialled once, so a restarted daemon is reached; a request is
// never written twice.
func (c *Client) Call(ctx context.Context, method string, params, result any) error {
	var raw json.RawMessage
	if params != nil {
		b, err := json.Marshal(params)
		if err != nil {
			return fmt.Errorf("storaged %s: encode: %w", method, err)
		}
		raw = b
	}
	resp, err := c.roundTrip(ctx, rpc.Request{Method: method, Params: raw})
	if err != nil {
		return fmt.Errorf("storaged %s: %w", method, err)
	}
	if resp.Error != nil {
		return resp.Error
	}
	if result != nil && len(resp.Result) > 0 {
		if err := json.Unmarshal(resp.Result, result); err != nil {
			return fmt.Errorf("storaged %s: decode result: %w", method, err)
		}
	}
	return nil
}

func (c *Client) roundTrip(ctx context.Context, req rpc.Request) (rpc.Response, error) {
	for attempt := 0; ; attempt++ {
		cn, err := c.getConn(ctx)
		if err != nil {
			return rpc.Response{}, err
		}
		req.ID = c.nextID()
		ch, err := cn.register(req.ID)
		if err == nil {
			err = cn.write(ctx, req)
			if err != nil {
				cn.unregister(req.ID)
			}
		}
		if err != nil {
			// Broken before the request went out (a daemon restart closes
			// every connection): redial once.
			if attempt == 0 && ctx.Err() == nil {
				continue
			}
			return rpc.Response{}, err
		}
		select {
		case resp := <-ch:
			return resp, nil
		case <-cn.done:
			// The answer may have arrived just before the break.
			select {
			case resp := <-ch:
				return resp, nil
			default:
			}
			return rpc.Response{}, fmt.Errorf("connection lost: %w", cn.err)
		case <-ctx.Done():
			cn.unregister(req.ID)
			return rpc.Response{}, ctx.Err()
		}
	}
}

// Create makes a runtime device from an image config.
func (c *Client) Create(ctx context.Context, p rpc.CreateParams) (rpc.Device, error) {
	var d rpc.Device
	err := c.Call(ctx, rpc.MethodCreate, p, &d)
	return d, err
}

// Delete removes a device and its state.
func (c *Client) Delete(ctx context.Context, id uint32) error {
	return c.Call(ctx, rpc.MethodDelete, rpc.IDParams{ID: id}, nil)
}

// Restack seals a device's upper into a new layer and continues on a fresh upper.
func (c *Client) Restack(ctx context.Context, p rpc.RestackParams) (rpc.RestackResult, error) {
	var r rpc.RestackResult
	err := c.Call(ctx, rpc.MethodRestack, p, &r)
	return r, err
}

// Localize moves a device's URL lowers onto local copies (rpc.LocalizeParams).
func (c *Client) Localize(ctx context.Context, p rpc.LocalizeParams) (rpc.Device, error) {
	var d rpc.Device
	err := c.Call(ctx, rpc.MethodLocalize, p, &d)
	return d, err
}

// AcquireShared references the shared read-only device of an image.
func (c *Client) AcquireShared(ctx context.Context, imageConfig, holder string) (rpc.Device, error) {
	return c.Acquire(ctx, rpc.AcquireParams{Image: imageConfig, Holder: holder})
}

// Acquire is AcquireShared with every option.
func (c *Client) Acquire(ctx context.Context, p rpc.AcquireParams) (rpc.Device, error) {
	var d rpc.Device
	err := c.Call(ctx, rpc.MethodAcquireShared, p, &d)
	return d, err
}

// ReleaseShared drops a holder's reference.
func (c *Client) ReleaseShared(ctx context.Context, id uint32, holder string) error {
	return c.Call(ctx, rpc.MethodReleaseShared, rpc.ReleaseParams{ID: id, Holder: holder}, nil)
}

// Prefetch pushes ranges of a shared FUSE file into the page cache.
func (c *Client) Prefetch(ctx context.Context, p rpc.PrefetchParams) (rpc.PrefetchResult, error) {
	var r rpc.PrefetchResult
	err := c.Call(ctx, rpc.MethodPrefetch, p, &r)
	return r, err
}

// List returns every device, lost ones included.
func (c *Client) List(ctx context.Context) ([]rpc.Device, error) {
	var r rpc.ListResult
	err := c.Call(ctx, rpc.MethodList, nil, &r)
	return r.Devices, err
}

// Reclaim deletes an owner's devices and references except those kept.
func (c *Client) Reclaim(ctx context.Context, owner string, keep ...uint32) (rpc.ReclaimResult, error) {
	var r rpc.ReclaimResult
	err := c.Call(ctx, rpc.MethodReclaim, rpc.ReclaimParams{Owner: owner, Keep: keep}, &r)
	return r, err
}

// Assign hands a runtime device to another owner.
func (c *Client) Assign(ctx context.Context, p rpc.AssignParams) (rpc.Device, error) {
	var r rpc.Device
	err := c.Call(ctx, rpc.MethodAssign, p, &r)
	return r, err
}

// Rebase moves a device never written onto another image's lowers.
func (c *Client) Rebase(ctx context.Context, p rpc.RebaseParams) (rpc.Device, error) {
	var r rpc.Device
	err := c.Call(ctx, rpc.MethodRebase, p, &r)
	return r, err
}

// Warm registers an image shape with the warm pool.
func (c *Client) Warm(ctx context.Context, p rpc.WarmParams) error {
	return c.Call(ctx, rpc.MethodWarm, p, nil)
}

// Features reports what the daemon supports.
func (c *Client) Features(ctx context.Context) (rpc.Features, error) {
	var f rpc.Features
	err := c.Call(ctx, rpc.MethodFeatures, nil, &f)
	return f, err
}

// Shutdown asks the daemon to stop its exports (keeping state) and exit.
func (c *Client) Shutdown(ctx context.Context) error {
	return c.Call(ctx, rpc.MethodShutdown, nil, nil)
}

// Devices is what the node needs of the storage daemon: implemented over
// RPC by *Client and in process by *daemon.Local, and checked against both
// by package devicestest. Errors match rpc.ErrNotFound, rpc.ErrConflict,
// rpc.ErrCapacity, rpc.ErrInvalid and rpc.ErrInternal with errors.Is.
type Devices interface {
	Create(ctx context.Context, p rpc.CreateParams) (rpc.Device, error)
	Delete(ctx context.Context, id uint32) error
	Restack(ctx context.Context, p rpc.RestackParams) (rpc.RestackResult, error)
	Localize(ctx context.Context, p rpc.LocalizeParams) (rpc.Device, error)
	Acquire(ctx context.Context, p rpc.AcquireParams) (rpc.Device, error)
	AcquireShared(ctx context.Context, imageConfig, holder string) (rpc.Device, error)
	ReleaseShared(ctx context.Context, id uint32, holder string) error
	List(ctx context.Context) ([]rpc.Device, error)
	Reclaim(ctx context.Context, owner string, keep ...uint32) (rpc.ReclaimResult, error)
	Assign(ctx context.Context, p rpc.AssignParams) (rpc.Device, error)
	Rebase(ctx context.Context, p rpc.RebaseParams) (rpc.Device, error)
	Warm(ctx context.Context, p rpc.WarmParams) error
	Prefetch(ctx context.Context, p rpc.PrefetchParams) (rpc.PrefetchResult, error)
	Features(ctx context.Context) (rpc.Features, error)
}

var _ Devices = (*Client)(nil)
