// Package client is the Go client of aenv-storaged, used by aenvd: one Unix
// socket connection carrying length-prefixed JSON calls (package rpc), one
// call at a time, redialled transparently after the daemon restarts.
package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/agentenv/agentenv/storage/daemon/rpc"
)

// Client talks to one daemon. It is safe for concurrent use; calls are serialised.
type Client struct {
	socket string

	mu   sync.Mutex
	conn net.Conn
	next uint64
}

// Dial connects to the daemon's RPC socket.
func Dial(ctx context.Context, socket string) (*Client, error) {
	c := &Client{socket: socket}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.connect(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *Client) connect(ctx context.Context) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.socket)
	if err != nil {
		return fmt.Errorf("storaged dial %s: %w", c.socket, err)
	}
	c.conn = conn
	return nil
}

// Close closes the connection. Devices are not affected.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		return nil
	}
	err := c.conn.Close()
	c.conn = nil
	return err
}

// Call performs one RPC. A broken connection is redialled once, before the
// request is sent, so a call is never sent twice.
func (c *Client) Call(ctx context.Context, method string, params, result any) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var raw json.RawMessage
	if params != nil {
		b, err := json.Marshal(params)
		if err != nil {
			return fmt.Errorf("storaged %s: encode: %w", method, err)
		}
		raw = b
	}
	if c.conn == nil {
		if err := c.connect(ctx); err != nil {
			return err
		}
	}
	c.next++
	req := rpc.Request{ID: c.next, Method: method, Params: raw}
	resp, err := c.roundTrip(ctx, req)
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
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Time{}
	}
	c.conn.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { c.conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	err := rpc.WriteFrame(c.conn, req)
	if err != nil {
		// The daemon may have restarted since the last call: redial once.
		c.conn.Close()
		if err := c.connect(ctx); err != nil {
			return rpc.Response{}, err
		}
		c.conn.SetDeadline(dl)
		err = rpc.WriteFrame(c.conn, req)
	}
	var resp rpc.Response
	if err == nil {
		err = rpc.ReadFrame(c.conn, &resp)
	}
	if err == nil && resp.ID != req.ID {
		err = fmt.Errorf("response id %d for request %d", resp.ID, req.ID)
	}
	if err != nil {
		c.conn.Close()
		c.conn = nil
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return rpc.Response{}, err
	}
	return resp, nil
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
