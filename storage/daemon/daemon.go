// Package daemon owns aenv-storaged: the long-running process that holds
// every block export of a layered image. It keeps a state directory
// (STATE/devices/ID/{device.json, image.GEN.json, upper.GEN.*, layers/}),
// exports each device through an Exporter (today NBD, on its own Unix socket
// RUN/nbd-ID.sock; ublk later behind the same interface), and
// answers a length-prefixed JSON RPC (package rpc) on a Unix socket: create,
// delete, restack, shared devices, warm pool, reclaim, features, shutdown.
//
// Devices outlive clients: nothing is tied to an RPC connection. A restarted
// daemon re-exports every device in its state directory, or reports it lost
// (with a reason) when its files are missing or changed; it never serves an
// image whose layers changed under it.
package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/nbd"
)

// Options configure a Daemon.
type Options struct {
	// Socket is the RPC socket path.
	Socket string
	// StateDir holds device records, runtime configs, uppers and sealed layers.
	StateDir string
	// RunDir holds the NBD export sockets.
	RunDir string
	Logger *slog.Logger
	// MaxDevices bounds device ids (default 4096).
	MaxDevices uint32
	// PoolLow and PoolHigh are the default warm-pool watermarks for every
	// writable image shape that Create sees; 0/0 leaves the pool to explicit Warm calls.
	PoolLow, PoolHigh int
	// NBD tunes every export's server.
	NBD nbd.Options
	// Exporter serves devices; default an NBDExporter on RunDir.
	Exporter Exporter
}

// Daemon is the storage daemon.
type Daemon struct {
	opts Options
	log  *slog.Logger
	ctx  context.Context // cancelled at shutdown; parent of every export

	ids      *idAllocator
	pool     *warmPool
	exporter Exporter

	mu      sync.Mutex
	devices map[uint32]*device
	shared  map[string]uint32 // image config path -> shared device id

	sharedMu sync.Mutex // serialises acquire/release so one image gets one export

	ready    context.Context // set once Run serves requests
	lockFile *os.File
	stopOnce sync.Once
	stopCh   chan struct{}
	bg       sync.WaitGroup // pool refills
}

// New prepares a daemon; Run starts it.
func New(opts Options) (*Daemon, error) {
	if opts.Socket == "" || opts.StateDir == "" || opts.RunDir == "" {
		return nil, errors.New("storaged: socket, state dir and run dir are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MaxDevices == 0 {
		opts.MaxDevices = 4096
	}
	if opts.PoolHigh < opts.PoolLow {
		opts.PoolHigh = opts.PoolLow
	}
	if opts.NBD.Logger == nil {
		opts.NBD.Logger = opts.Logger
	}
	d := &Daemon{
		opts: opts, log: opts.Logger, ids: newIDAllocator(opts.MaxDevices),
		devices: make(map[uint32]*device), shared: make(map[string]uint32), stopCh: make(chan struct{}),
	}
	d.pool = newWarmPool(d)
	d.exporter = opts.Exporter
	if d.exporter == nil {
		d.exporter = &NBDExporter{RunDir: opts.RunDir, Opts: opts.NBD, Log: opts.Logger}
	}
	return d, nil
}

// Run recovers the state directory, serves the RPC socket until ctx is done
// or a client calls shutdown, then stops every export (keeping state on disk).
func (d *Daemon) Run(ctx context.Context) error {
	for _, dir := range []string{d.devicesDir(), d.opts.RunDir, filepath.Dir(d.opts.Socket)} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("storaged: %w", err)
		}
	}
	if err := d.lockState(); err != nil {
		return err
	}
	defer d.lockFile.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	d.ctx = ctx
	if err := d.recover(); err != nil {
		return err
	}
	ln, err := d.listenRPC()
	if err != nil {
		d.stopAll()
		return err
	}
	d.mu.Lock()
	d.ready = ctx
	n := len(d.devices)
	d.mu.Unlock()
	d.log.Info("storaged ready", "socket", d.opts.Socket, "state", d.opts.StateDir, "devices", n)
	go func() {
		select {
		case <-ctx.Done():
		case <-d.stopCh:
		}
		ln.Close()
	}()
	var conns sync.WaitGroup
	for {
		c, err := ln.Accept()
		if err != nil {
			break
		}
		conns.Add(1)
		go func() { defer conns.Done(); d.serveRPC(ctx, c) }()
	}
	cancel()
	d.bg.Wait()
	d.stopAll()
	conns.Wait()
	d.log.Info("storaged stopped")
	return nil
}

// lockState takes an exclusive flock on STATE/lock: two daemons on one
// state directory would corrupt each other's uppers.
func (d *Daemon) lockState() error {
	f, err := os.OpenFile(filepath.Join(d.opts.StateDir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("storaged: lock state dir: %w", err)
	}
	// A daemon that is just exiting (or a forked child that has not yet
	// exec'd and closed its inherited descriptors) may hold the lock for a
	// moment: retry briefly before giving up.
	for wait := 10 * time.Millisecond; ; wait *= 2 {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			d.lockFile = f
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || wait > 2*time.Second {
			f.Close()
			return fmt.Errorf("storaged: state dir %s is in use by another daemon: %w", d.opts.StateDir, err)
		}
		time.Sleep(wait)
	}
}

func (d *Daemon) listenRPC() (net.Listener, error) {
	os.Remove(d.opts.Socket) // safe: we hold the state lock, so no live daemon owns it
	ln, err := net.Listen("unix", d.opts.Socket)
	if err != nil {
		return nil, fmt.Errorf("storaged: listen on %s: %w", d.opts.Socket, err)
	}
	return ln, nil
}

// recover re-exports every device in the state directory, or marks it lost.
func (d *Daemon) recover() error {
	recs, broken, err := d.scanState()
	if err != nil {
		return err
	}
	for id, why := range broken {
		d.ids.reserve(id)
		d.devices[id] = &device{rec: record{ID: id}, lost: "unreadable record: " + why}
		d.log.Error("device lost", "device", id, "reason", why)
	}
	for _, r := range recs {
		dv := &device{rec: *r}
		if !d.ids.reserve(r.ID) {
			d.log.Error("device ignored: id out of range or duplicate", "device", r.ID, "max", d.opts.MaxDevices)
			continue
		}
		d.devices[r.ID] = dv
		if why := checkStamps(r.Stamps); why != "" {
			dv.lost = why
		} else if err := d.start(dv); err != nil {
			dv.lost = err.Error()
		}
		if dv.lost != "" {
			os.Remove(d.socketPath(r.ID))
			d.log.Error("device lost", "device", r.ID, "reason", dv.lost)
			continue
		}
		switch r.Kind {
		case rpc.KindShared:
			d.shared[r.Image] = r.ID
		case rpc.KindPool:
			d.pool.adopt(r.ID, shapeOf(r))
		}
		d.log.Info("device re-exported", "device", r.ID, "kind", r.Kind, "socket", d.socketPath(r.ID))
	}
	if err := d.loadPool(); err != nil {
		// The pool is an optimisation: a bad config file must not stop the daemon.
		d.log.Error("warm pool config ignored", "err", err)
	}
	return nil
}

// ctxReady returns the run context once Run has recovered its state (for tests).
func (d *Daemon) ctxReady() context.Context {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ready
}

func (d *Daemon) stop() { d.stopOnce.Do(func() { close(d.stopCh) }) }

func (d *Daemon) stopAll() {
	d.mu.Lock()
	devs := make([]*device, 0, len(d.devices))
	for _, dv := range d.devices {
		devs = append(devs, dv)
	}
	d.mu.Unlock()
	for _, dv := range devs {
		dv.op.Lock()
		if err := dv.stop(); err != nil {
			d.log.Error("stop device", "device", dv.rec.ID, "err", err)
		}
		dv.op.Unlock()
	}
}

// serveRPC answers requests on one client connection until it closes.
func (d *Daemon) serveRPC(ctx context.Context, c net.Conn) {
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	for {
		var req rpc.Request
		if err := rpc.ReadFrame(c, &req); err != nil {
			if !errors.Is(err, io.EOF) && ctx.Err() == nil {
				d.log.Warn("rpc: dropping client", "err", err)
			}
			return
		}
		resp := rpc.Response{ID: req.ID}
		result, err := d.dispatch(ctx, req)
		if err != nil {
			resp.Error = toRPCError(err)
		} else if resp.Result, err = json.Marshal(result); err != nil {
			resp.Error = &rpc.Error{Code: rpc.CodeInternal, Message: err.Error()}
		}
		if err := rpc.WriteFrame(c, resp); err != nil {
			return
		}
		if req.Method == rpc.MethodShutdown && resp.Error == nil {
			d.stop()
		}
	}
}

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
	case rpc.MethodAcquireShared:
		return call(ctx, req.Params, d.acquire)
	case rpc.MethodReleaseShared:
		return call(ctx, req.Params, func(ctx context.Context, p rpc.ReleaseParams) (struct{}, error) {
			return struct{}{}, d.release(ctx, p)
		})
	case rpc.MethodReclaim:
		return call(ctx, req.Params, d.reclaim)
	case rpc.MethodWarm:
		return call(ctx, req.Params, func(ctx context.Context, p rpc.WarmParams) (struct{}, error) {
			return struct{}{}, d.warm(p)
		})
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

func (d *Daemon) features() rpc.Features {
	return rpc.Features{
		ProtocolVersion: rpc.ProtocolVersion, Exports: []string{d.exporter.Name()},
		Restack: true, SharedDevices: true, WarmPool: true, TCP: true,
		KernelNBD: nbd.KernelAvailable() == nil,
	}
}

func (d *Daemon) list() rpc.ListResult {
	d.mu.Lock()
	devs := make([]*device, 0, len(d.devices))
	for _, dv := range d.devices {
		devs = append(devs, dv)
	}
	d.mu.Unlock()
	out := rpc.ListResult{Devices: []rpc.Device{}}
	for _, dv := range devs {
		dv.op.Lock()
		out.Devices = append(out.Devices, dv.info(d))
		dv.op.Unlock()
	}
	sort.Slice(out.Devices, func(i, j int) bool { return out.Devices[i].ID < out.Devices[j].ID })
	return out
}

func (d *Daemon) lookup(id uint32) (*device, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	dv, ok := d.devices[id]
	if !ok {
		return nil, errf(rpc.CodeNotFound, "device %d", id)
	}
	return dv, nil
}
