// Package daemon owns aenv-storaged: the long-running process that holds
// every block export of a layered image. It keeps a state directory, exports
// each device through an Exporter (NBD, on its own Unix socket
// RUN/nbd-ID.sock, plus /dev/nbdN, /dev/ublkbN or, for a shared read-only
// device mapped as memory, a file on the daemon's FUSE mount RUN/mem; see
// memexport.go), and answers a
// length-prefixed JSON RPC (package rpc) on a Unix socket: create, delete,
// restack, localize (URL lowers moved onto local copies), shared devices,
// warm pool, reclaim, features, shutdown. Requests
// of one connection run concurrently. Local is the same API in process.
//
// Devices outlive clients: nothing is tied to an RPC connection. A restarted
// daemon re-exports every device in its state directory, or reports it lost
// (with a reason) when its files are missing or changed; it never serves an
// image whose layers changed under it.
//
// # State directory (0700; every file 0600, every socket 0600)
//
//	STATE/lock                       flock: one daemon per state directory
//	STATE/pool.json                  warm-pool watermarks set by Warm
//	STATE/trash/ID-NONCE/            a deleted device's directory, removed at leisure
//	STATE/devices/ID/device.json     the record: kind, owner, layers, stamps, generation
//	STATE/devices/ID/image.GEN.json  the config the export serves
//	STATE/devices/ID/image.GEN.NONCE.json  the same once URL lowers moved to files (localize.go)
//	STATE/devices/ID/upper.GEN.{data,index}
//	STATE/devices/ID/upper.GEN.index.pending  mappings answered, not flushed (lsmt)
//	STATE/devices/ID/layers/layer-GEN.lsmt   sealed by restack
//	STATE/devices/ID/restack.json    the journal of a restack in progress
//
// # Durability rules
//
//   - A record never names a file that is not complete on disk: every state
//     file is written with internal/atomicfile (temp, fsync, rename, fsync
//     the directory), files written in place (uppers, sealed layers) are
//     fsynced and their directory synced before the record or config that
//     names them is written.
//   - device.json is the commit point of every transition: a create commits
//     when its record lands (a directory without one is removed at startup),
//     a restack when the record names the new generation, a delete when its
//     directory is renamed into the trash.
//   - A multi-step transition records its intent first with enough to finish
//     or undo it (restack.json, see restack.go); startup finishes or rolls
//     back each one before exporting anything.
//   - Nothing is left that no record owns: at startup the trash is emptied,
//     files in a device directory its record does not name are removed, and
//     export sockets no live device serves are removed; each removal is
//     logged.
//   - Every step has a failpoint (failpoints.go, "storaged/..."), and
//     TestCrashMatrix kills the daemon at each in turn, restarts it and
//     checks the device's bytes, the absence of orphans and that the
//     operation can be retried. TestPowerLoss* cut the power (crashdisk) at
//     each restack step and check the record always names complete files.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/agentenv/agentenv/storage/blob"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/image"
	"github.com/agentenv/agentenv/storage/memfs"
	"github.com/agentenv/agentenv/storage/nbd"
	"github.com/agentenv/agentenv/storage/ublk"
)

// Options configure a Daemon.
type Options struct {
	// Socket is the RPC socket path; empty: no RPC, the daemon is used in
	// process only (through Local).
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
	// SharedBlock is how shared read-only devices are exported for VMMs
	// that map them as memory (memexport.go): SharedDefault (ublk where
	// loaded), SharedAuto (ublk, else FUSE), rpc.BlockUblk, rpc.BlockFUSE
	// or SharedNone. Chosen once at start.
	SharedBlock string
	// MemFS configures the FUSE mount of shared memory files (RUN/mem).
	// Its KeeperSocket defaults to RUN/mem.keeper: the mount's connection
	// is held by a keeper process (this executable, see
	// memfs.RunKeeperIfAsked) so that a restarted daemon, even after
	// SIGKILL, takes the mount over and its VMs' mappings stay valid.
	MemFS memfs.Options
	// LayerWait bounds how long a read of a lazily restored layer waits for
	// the node's layer socket while aenvd, which serves it, is away
	// (restarting); default blob.DefaultServerWait. Past it the read fails:
	// an I/O error in the guest.
	LayerWait time.Duration
}

// imageOptions are the options every image of a device is opened with.
func (d *Daemon) imageOptions(readOnly bool) image.Options {
	return image.Options{ReadOnly: readOnly, HTTP: blob.HTTPOptions{ServerWait: d.opts.LayerWait, Log: d.log}}
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

	sharedMu    sync.Mutex    // serialises acquire/release so one image gets one export
	sharedBlock string        // how shared devices are exported (openShared)
	files       *memfs.Server // the FUSE mount of shared memory files, or nil
	digests     digestMemo    // the local copies localize checked (localize.go)

	ready    context.Context // set once Run serves requests
	readyCh  chan struct{}   // closed at the same time
	lockFile *os.File
	stopOnce sync.Once
	stopCh   chan struct{}
	bg       sync.WaitGroup // pool refills
}

// New prepares a daemon; Run starts it.
func New(opts Options) (*Daemon, error) {
	if opts.StateDir == "" || opts.RunDir == "" {
		return nil, errors.New("storaged: state dir and run dir are required")
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
		readyCh: make(chan struct{}),
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
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if err := d.open(ctx); err != nil {
		return err
	}
	defer d.lockFile.Close()
	var ln net.Listener
	if d.opts.Socket != "" {
		var err error
		if ln, err = d.listenRPC(); err != nil {
			d.stopAll()
			d.closeShared()
			return err
		}
	}
	d.mu.Lock()
	d.ready = ctx
	n := len(d.devices)
	d.mu.Unlock()
	close(d.readyCh)
	d.log.Info("storaged ready", "socket", d.opts.Socket, "state", d.opts.StateDir, "devices", n)
	var conns sync.WaitGroup
	if ln != nil {
		go func() {
			select {
			case <-ctx.Done():
			case <-d.stopCh:
			}
			ln.Close()
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				break
			}
			conns.Add(1)
			go func() { defer conns.Done(); d.serveRPC(ctx, c) }()
		}
	} else {
		select {
		case <-ctx.Done():
		case <-d.stopCh:
		}
	}
	cancel()
	d.bg.Wait()
	d.stopAll()
	conns.Wait()
	d.closeShared()
	d.log.Info("storaged stopped")
	return nil
}

// open makes the directories private, takes the state lock and recovers
// the state directory; ctx bounds every export.
func (d *Daemon) open(ctx context.Context) error {
	dirs := []string{d.opts.StateDir, d.devicesDir(), d.trashDir(), d.opts.RunDir}
	if d.opts.Socket != "" {
		dirs = append(dirs, filepath.Dir(d.opts.Socket))
	}
	for _, dir := range dirs {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("storaged: %w", err)
		}
	}
	// The state holds every sandbox's disk: only root reads it, whatever
	// mode an earlier version or an operator left. The run directory is
	// searchable, not listable: a confined VMM, chrooted into it, reaches
	// its own socket (each is 0600, its VMM's or root's) and nothing else.
	modes := map[string]os.FileMode{d.opts.StateDir: 0o700, d.opts.RunDir: 0o711}
	for dir, mode := range modes {
		if err := os.Chmod(dir, mode); err != nil {
			return fmt.Errorf("storaged: %w", err)
		}
	}
	if err := d.lockState(); err != nil {
		return err
	}
	d.ctx = ctx
	if err := d.openShared(); err != nil {
		d.lockFile.Close()
		return err
	}
	if err := d.recover(); err != nil {
		d.closeShared()
		d.lockFile.Close()
		return err
	}
	// Only now: a mount taken over from a previous daemon is asked about
	// the exports the kernel knows, which recover has just added again.
	if err := d.serveShared(); err != nil {
		d.stopAll()
		d.closeShared()
		d.lockFile.Close()
		return err
	}
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
	// Whoever connects can create and delete every device: root only.
	if err := os.Chmod(d.opts.Socket, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("storaged: %w", err)
	}
	return ln, nil
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

func (d *Daemon) features() rpc.Features {
	f := rpc.Features{
		ProtocolVersion: rpc.ProtocolVersion, Exports: []string{d.exporter.Name()},
		Restack: true, Localize: true, SharedDevices: true, WarmPool: true, Assign: true, Rebase: true, TCP: true,
		KernelNBD: nbd.KernelAvailable() == nil, Ublk: ublk.Available() == nil, SharedBlock: d.sharedBlock,
	}
	if f.Ublk {
		f.Exports = append(f.Exports, rpc.BlockUblk)
	}
	if d.files != nil {
		f.Exports = append(f.Exports, rpc.BlockFUSE)
	}
	return f
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
		out.Devices = append(out.Devices, dv.info(d))
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
