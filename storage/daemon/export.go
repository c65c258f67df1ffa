package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/memfs"
	"github.com/agentenv/agentenv/storage/nbd"
	"github.com/agentenv/agentenv/storage/ublk"
)

// Exporter makes a device's backend reachable by a VMM. NBDExporter is the
// one built today; a ublk exporter will implement the same interface, so the
// daemon's device lifecycle (create, restack, shared, pool, recovery) does
// not change with the transport.
type Exporter interface {
	// Name is the transport ("nbd"), reported in Features.
	Name() string
	// Export starts serving spec.Backend. The export must tolerate the
	// backend pausing I/O (restack) and must not close it.
	Export(ctx context.Context, spec ExportSpec) (Export, error)
}

// ExportSpec describes one export.
type ExportSpec struct {
	ID          uint32
	Name        string // unique, includes a nonce: a stale client of a reused id cannot connect
	Description string
	Backend     nbd.Backend
	ReadOnly    bool
	TCP         bool   // also on a loopback TCP port
	Block       string // also as a kernel block device of this kind (rpc.BlockNBD, rpc.BlockUblk)
	// UblkID, when set, is the ublk device a previous daemon served: it is
	// recovered (its users' I/O resumes) instead of a new one made.
	UblkID *uint32
	// ConnectAs, when set, owns the Unix socket (see rpc.CreateParams).
	ConnectAs *rpc.Identity
}

// Export is a running export.
type Export interface {
	Endpoint() Endpoint
	// Stop drops every client and stops serving; it does not close the backend.
	Stop()
}

// Endpoint says where a running export is reached.
type Endpoint struct {
	Socket      string // Unix socket
	URI         string // for QEMU and libnbd
	TCP         string // loopback host:port, if requested
	BlockDevice string // /dev/nbdN, /dev/ublkbN or the FUSE file, if requested
	Block       string // its kind: rpc.BlockNBD, rpc.BlockUblk or rpc.BlockFUSE
	UblkID      uint32 // the ublk device id, for Block rpc.BlockUblk
}

// NBDExporter exports each device from its own nbd.Server on
// RunDir/nbd-ID.sock (plus loopback TCP and /dev/nbdN on request).
type NBDExporter struct {
	RunDir string
	Opts   nbd.Options
	Log    *slog.Logger
	// Files, when set, serves rpc.BlockFUSE exports (shared memory files).
	Files *memfs.Server
}

// Name implements Exporter.
func (x *NBDExporter) Name() string { return "nbd" }

func (x *NBDExporter) socketPath(id uint32) string {
	return filepath.Join(x.RunDir, fmt.Sprintf("nbd-%d.sock", id))
}

// Export implements Exporter.
func (x *NBDExporter) Export(ctx context.Context, spec ExportSpec) (Export, error) {
	e := &nbdExport{srv: nbd.NewServer(x.Opts)}
	err := e.srv.Add(nbd.Export{Name: spec.Name, Description: spec.Description, Backend: spec.Backend, ReadOnly: spec.ReadOnly})
	if err == nil {
		err = e.listen(x.socketPath(spec.ID), spec.TCP, spec.ConnectAs)
	}
	if err != nil {
		e.Stop()
		return nil, fmt.Errorf("export device %d: %w", spec.ID, err)
	}
	ctx, e.cancel = context.WithCancel(ctx)
	for _, l := range e.lns {
		e.served.Add(1)
		go func() {
			defer e.served.Done()
			if err := e.srv.Serve(ctx, l); err != nil {
				x.Log.Warn("nbd export stopped", "device", spec.ID, "err", err)
			}
		}()
	}
	e.ep.URI = "nbd+unix:///" + spec.Name + "?socket=" + e.ep.Socket
	if err := e.attach(ctx, spec, x.Files, x.Log); err != nil {
		e.Stop()
		return nil, fmt.Errorf("export device %d: %w", spec.ID, err)
	}
	return e, nil
}

// attach adds the kernel block device the spec asks for, next to the
// socket export.
func (e *nbdExport) attach(ctx context.Context, spec ExportSpec, files *memfs.Server, log *slog.Logger) error {
	switch spec.Block {
	case rpc.BlockNone:
		return nil
	case rpc.BlockNBD:
		// Two connections: the kernel spreads requests over them.
		kd, err := nbd.AttachKernel(ctx, e.srv, spec.Name, 2)
		if err != nil {
			return err
		}
		e.kdev, e.ep.BlockDevice = kd, kd.Path
	case rpc.BlockFUSE:
		if err := e.attachFile(spec, files); err != nil {
			return err
		}
	case rpc.BlockUblk:
		ud, err := attachUblk(ctx, spec, log)
		if err != nil {
			return err
		}
		e.udev, e.ep.BlockDevice, e.ep.UblkID = ud, ud.Path, ud.ID
	default:
		return fmt.Errorf("unknown block device kind %q", spec.Block)
	}
	e.ep.Block = spec.Block
	return nil
}

type nbdExport struct {
	srv    *nbd.Server
	lns    []net.Listener
	cancel context.CancelFunc
	served sync.WaitGroup
	kdev   *nbd.KernelDevice
	udev   *ublk.Device
	ep     Endpoint

	files    *memfs.Server // the FUSE mount holding fileName, for rpc.BlockFUSE
	fileName string
}

// listen opens the Unix socket (replacing one left by a dead daemon) and
// optionally a loopback TCP port.
func (e *nbdExport) listen(sock string, tcp bool, as *rpc.Identity) error {
	os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return err
	}
	e.lns, e.ep.Socket = append(e.lns, ln), sock
	if err := ownSocket(sock, as); err != nil {
		return err
	}
	if !tcp {
		return nil
	}
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	e.lns, e.ep.TCP = append(e.lns, tl), tl.Addr().String()
	return nil
}

func (e *nbdExport) Endpoint() Endpoint { return e.ep }

// ownSocket hands the device's export socket, if it has one, to as.
func (dv *device) ownSocket(as *rpc.Identity) error {
	if dv.exp == nil || dv.exp.Endpoint().Socket == "" {
		return nil
	}
	return ownSocket(dv.exp.Endpoint().Socket, as)
}

// ownSocket makes an export socket reachable by root and as only: it is a
// sandbox's disk, and a confined VMM reconnects to it as its own identity.
func ownSocket(sock string, as *rpc.Identity) error {
	if err := os.Chmod(sock, 0o600); err != nil {
		return err
	}
	if as == nil {
		return nil
	}
	return os.Lchown(sock, int(as.UID), int(as.GID))
}

func (e *nbdExport) Stop() {
	e.detachFile()
	if e.kdev != nil {
		// Detach first, so the kernel flushes while the export still answers.
		e.kdev.Detach()
		e.kdev = nil
	}
	if e.udev != nil {
		// Removing the device completes or fails its I/O first.
		if err := e.udev.Close(); err != nil {
			slog.Default().Warn("remove ublk device", "device", e.udev.Path, "err", err)
		}
		e.udev = nil
	}
	if e.cancel != nil {
		e.cancel()
	}
	for _, l := range e.lns {
		l.Close()
	}
	e.served.Wait()
	e.srv.Close()
	e.lns = nil
}

// attachUblk serves spec.Backend as a ublk device made recoverable, so a
// crash of the daemon leaves /dev/ublkbN to its users, quiesced; the next
// daemon re-attaches to the device its record names. A device that cannot
// be recovered (the kernel removed it, or it was never quiesced) is
// replaced by a new one.
func attachUblk(ctx context.Context, spec ExportSpec, log *slog.Logger) (*ublk.Device, error) {
	opts := ublk.Options{ReadOnly: spec.ReadOnly, Queues: 1, Depth: 64, Recovery: true, Log: log}
	if spec.UblkID != nil {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ud, err := ublk.Recover(rctx, *spec.UblkID, spec.Backend, opts)
		cancel()
		if err == nil {
			log.Info("ublk device recovered", "device", spec.ID, "ublk", ud.Path)
			return ud, nil
		}
		log.Warn("ublk device not recoverable; making a new one", "device", spec.ID, "ublk", *spec.UblkID, "err", err)
	}
	return ublk.Create(ctx, spec.Backend, opts)
}
