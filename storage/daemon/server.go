package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/agentenv/agentenv/storage/daemon/rpc"
)

// MaxInFlight bounds the requests one connection runs at once; the
// connection's reader stops reading while that many run, so a client that
// floods the socket is slowed, not the daemon.
const MaxInFlight = 32

// serveRPC answers requests on one client connection until it closes. Each
// request runs in its own goroutine and is answered when done, so answers
// may come out of order (they carry the request's id).
func (d *Daemon) serveRPC(ctx context.Context, c net.Conn) {
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	var (
		wmu      sync.Mutex // one frame at a time on the socket
		inflight sync.WaitGroup
		slots    = make(chan struct{}, MaxInFlight)
	)
	defer inflight.Wait()
	for {
		var req rpc.Request
		if err := rpc.ReadFrame(c, &req); err != nil {
			if !errors.Is(err, io.EOF) && ctx.Err() == nil {
				d.log.Warn("rpc: dropping client", "err", err)
			}
			return
		}
		slots <- struct{}{}
		inflight.Add(1)
		go func() {
			defer func() { <-slots; inflight.Done() }()
			resp := d.answer(ctx, req)
			wmu.Lock()
			err := rpc.WriteFrame(c, resp)
			wmu.Unlock()
			if err != nil {
				c.Close()
				return
			}
			if req.Method == rpc.MethodShutdown && resp.Error == nil {
				d.stop()
			}
		}()
	}
}

// answer runs one request.
func (d *Daemon) answer(ctx context.Context, req rpc.Request) rpc.Response {
	resp := rpc.Response{ID: req.ID}
	result, err := d.dispatch(ctx, req)
	if err != nil {
		resp.Error = toRPCError(err)
	} else if resp.Result, err = json.Marshal(result); err != nil {
		resp.Error = &rpc.Error{Code: rpc.CodeInternal, Message: err.Error()}
	}
	return resp
}

// toRPCError gives every error a code: its own if it carries one (however
// deeply wrapped), else internal. Only validation of parameters produces
// invalid.
func toRPCError(err error) *rpc.Error {
	var re *rpc.Error
	if errors.As(err, &re) {
		return &rpc.Error{Code: re.Code, Message: err.Error()}
	}
	return &rpc.Error{Code: rpc.CodeInternal, Message: err.Error()}
}

func errf(code, format string, args ...any) error {
	return &rpc.Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

func decode[T any](raw json.RawMessage) (T, error) {
	var v T
	if len(raw) == 0 {
		return v, nil
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return v, errf(rpc.CodeInvalid, "params: %v", err)
	}
	return v, nil
}

func (d *Daemon) dispatch(ctx context.Context, req rpc.Request) (any, error) {
	select {
	case <-d.stopCh:
		return nil, errf(rpc.CodeShuttingDown, "daemon is shutting down")
	default:
	}
	switch req.Method {
	case rpc.MethodCreate:
		return call(ctx, req.Params, d.create)
	case rpc.MethodDelete:
		return call(ctx, req.Params, func(ctx context.Context, p rpc.IDParams) (struct{}, error) {
			return struct{}{}, d.delete(ctx, p.ID, false)
		})
	case rpc.MethodRestack:
		return call(ctx, req.Params, d.restack)
	case rpc.MethodLocalize:
		return call(ctx, req.Params, d.localize)
	case rpc.MethodAcquireShared:
		return call(ctx, req.Params, d.acquire)
	case rpc.MethodReleaseShared:
		return call(ctx, req.Params, func(ctx context.Context, p rpc.ReleaseParams) (struct{}, error) {
			return struct{}{}, d.release(ctx, p)
		})
	case rpc.MethodReclaim:
		return call(ctx, req.Params, d.reclaim)
	case rpc.MethodAssign:
		return call(ctx, req.Params, d.assign)
	case rpc.MethodRebase:
		return call(ctx, req.Params, d.rebase)
	case rpc.MethodWarm:
		return call(ctx, req.Params, func(ctx context.Context, p rpc.WarmParams) (struct{}, error) {
			return struct{}{}, d.warm(p)
		})
	case rpc.MethodPrefetch:
		return call(ctx, req.Params, d.prefetch)
	case rpc.MethodList:
		return d.list(), nil
	case rpc.MethodFeatures:
		return d.features(), nil
	case rpc.MethodShutdown:
		return struct{}{}, nil
	default:
		return nil, errf(rpc.CodeInvalid, "unknown method %q", req.Method)
	}
}

func call[P, R any](ctx context.Context, raw json.RawMessage, fn func(context.Context, P) (R, error)) (any, error) {
	p, err := decode[P](raw)
	if err != nil {
		return nil, err
	}
	return fn(ctx, p)
}
