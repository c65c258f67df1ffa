package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"

	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/memfs"
	"github.com/agentenv/agentenv/storage/ublk"
	"github.com/agentenv/agentenv/vmm/memsnap"
)

// Shared memory exports. A shared read-only device that a VMM maps as guest
// memory needs a path the kernel pages from: a ublk block device where the
// driver is loaded, else a file on the daemon's FUSE mount (package memfs,
// at RUN/mem). Which one is chosen once, when the daemon starts
// (Options.SharedBlock), and logged with the reason; Acquire of the other
// kind is refused, so one daemon's shared devices all behave alike.

// Options.SharedBlock values besides rpc.BlockUblk and rpc.BlockFUSE.
const (
	// SharedDefault (empty) is ublk where the driver is loaded, else no
	// kernel-visible shared export (the behaviour before FUSE exports).
	SharedDefault = ""
	// SharedAuto is ublk where the driver is loaded, else FUSE where
	// /dev/fuse exists and the mount can be made, else none.
	SharedAuto = "auto"
	// SharedNone makes no kernel-visible shared export.
	SharedNone = "none"
)

// chooseShared resolves Options.SharedBlock against the machine.
func chooseShared(want string) (kind, why string, err error) {
	ublkErr := ublk.Available()
	switch want {
	case SharedDefault, SharedAuto:
		if ublkErr == nil {
			return rpc.BlockUblk, "the ublk driver is loaded", nil
		}
		if want == SharedDefault {
			return rpc.BlockNone, fmt.Sprintf("no ublk (%v) and FUSE exports not asked for", ublkErr), nil
		}
		if _, err := os.Stat("/dev/fuse"); err != nil {
			return rpc.BlockNone, fmt.Sprintf("no ublk (%v) and no FUSE device (%v)", ublkErr, err), nil
		}
		return rpc.BlockFUSE, fmt.Sprintf("no ublk (%v): FUSE", ublkErr), nil
	case SharedNone:
		return rpc.BlockNone, "configured", nil
	case rpc.BlockUblk:
		if ublkErr != nil {
			return "", "", fmt.Errorf("storaged: shared block %q: %w", want, ublkErr)
		}
		return rpc.BlockUblk, "configured", nil
	case rpc.BlockFUSE:
		return rpc.BlockFUSE, "configured", nil
	}
	return "", "", fmt.Errorf("storaged: unknown shared block %q (want %q, %q, %q or %q)", want, SharedAuto, rpc.BlockUblk, rpc.BlockFUSE, SharedNone)
}

// memDir is the FUSE mount point of shared memory files.
func (d *Daemon) memDir() string { return filepath.Join(d.opts.RunDir, rpc.SharedFileDir) }

// memKeeperSocket is where the FUSE mount's keeper answers.
func (d *Daemon) memKeeperSocket() string { return filepath.Join(d.opts.RunDir, "mem.keeper") }

// openShared chooses the shared export kind and, for FUSE, takes over the
// mount a previous daemon left (its keeper still holding the connection)
// or mounts afresh; serving starts in serveShared, once recover has added
// the exports back.
func (d *Daemon) openShared() error {
	kind, why, err := chooseShared(d.opts.SharedBlock)
	if err != nil {
		return err
	}
	if kind == rpc.BlockFUSE {
		mo := d.opts.MemFS
		if mo.Logger == nil {
			mo.Logger = d.log
		}
		if mo.KeeperSocket == "" {
			mo.KeeperSocket = d.memKeeperSocket()
		}
		files, err := memfs.Open(d.memDir(), mo)
		switch {
		case err != nil && d.opts.SharedBlock == SharedAuto:
			// Asked for whatever works: a host whose /dev/fuse cannot be
			// mounted (a container without the capability) goes on
			// without shared exports, as one without the device does.
			kind, why = rpc.BlockNone, fmt.Sprintf("the FUSE mount failed: %v", err)
		case err != nil:
			return fmt.Errorf("storaged: shared memory exports over FUSE: %w", err)
		default:
			d.files = files
			if x, ok := d.exporter.(*NBDExporter); ok {
				x.Files = files
			}
		}
	}
	d.sharedBlock = kind
	d.log.Info("shared memory exports", "kind", kind, "why", why, "mount", d.filesDir(), "taken_over", d.files != nil && d.files.Adopted())
	return nil
}

// serveShared starts serving the FUSE mount, if any.
func (d *Daemon) serveShared() error {
	if d.files == nil {
		return nil
	}
	if d.files.Adopted() {
		if err := fpFUSETakenOver.Inject(); err != nil {
			return err
		}
	}
	if err := d.files.Serve(); err != nil {
		return fmt.Errorf("storaged: serve shared memory exports: %w", err)
	}
	return nil
}

func (d *Daemon) filesDir() string {
	if d.files == nil {
		return ""
	}
	return d.files.Dir()
}

// closeShared unmounts the FUSE mount, if any.
func (d *Daemon) closeShared() {
	if d.files == nil {
		return
	}
	if err := d.files.Close(); err != nil {
		d.log.Error("unmount shared memory exports", "mount", d.files.Dir(), "err", err)
	}
}

// checkSharedKind refuses a shared device of a memory kind the daemon did
// not choose at start.
func (d *Daemon) checkSharedKind(block string) error {
	if (block == rpc.BlockUblk || block == rpc.BlockFUSE) && block != d.sharedBlock {
		return errf(rpc.CodeInvalid, "shared devices here are exported as %q (chosen at start), not %q", d.sharedBlock, block)
	}
	return nil
}

// attachFile adds spec's backend as a file on the FUSE mount.
func (e *nbdExport) attachFile(spec ExportSpec, files *memfs.Server) error {
	if files == nil {
		return fmt.Errorf("device %d: no FUSE mount for shared memory files (see the daemon's shared block)", spec.ID)
	}
	if !spec.ReadOnly {
		return fmt.Errorf("device %d: only read-only devices are exported as FUSE files", spec.ID)
	}
	path, err := files.Add(spec.Name, spec.Backend, spec.Backend.Size())
	if err != nil {
		return err
	}
	e.files, e.fileName, e.ep.BlockDevice = files, spec.Name, path
	return nil
}

// detachFile removes the export's FUSE file (a VMM that maps it keeps
// reading until it closes it).
func (e *nbdExport) detachFile() {
	if e.files == nil {
		return
	}
	if err := e.files.Release(e.fileName); err != nil {
		slog.Default().Warn("remove shared memory file", "export", e.fileName, "err", err)
	}
	e.files = nil
}

// SharedFileStats returns what the FUSE mount of shared memory files has
// served, and false when the daemon has none.
func (d *Daemon) SharedFileStats() (memfs.Stats, bool) {
	if d.files == nil {
		return memfs.Stats{}, false
	}
	return d.files.Stats(), true
}

// prefetch pushes ranges of a shared device's FUSE file into the page
// cache.
func (d *Daemon) prefetch(_ context.Context, p rpc.PrefetchParams) (rpc.PrefetchResult, error) {
	if len(p.Ranges) > rpc.MaxPrefetchRanges {
		return rpc.PrefetchResult{}, errf(rpc.CodeInvalid, "%d ranges: at most %d", len(p.Ranges), rpc.MaxPrefetchRanges)
	}
	if p.Pack != "" && (len(p.Ranges) > 0 || !filepath.IsAbs(p.Pack)) {
		return rpc.PrefetchResult{}, errf(rpc.CodeInvalid, "pack %q with %d ranges: an absolute path and no ranges", p.Pack, len(p.Ranges))
	}
	ranges := make([]memfs.Range, len(p.Ranges))
	for i, r := range p.Ranges {
		if r.Off < 0 || r.Len < 0 || r.Off > math.MaxInt64-r.Len {
			return rpc.PrefetchResult{}, errf(rpc.CodeInvalid, "range %d+%d", r.Off, r.Len)
		}
		ranges[i] = memfs.Range{Off: r.Off, Len: r.Len}
	}
	dv, err := d.lockDevice(p.ID)
	if err != nil {
		return rpc.PrefetchResult{}, err
	}
	defer dv.op.Unlock()
	info := dv.info(d)
	if info.State != rpc.StateActive || info.Block != rpc.BlockFUSE || d.files == nil {
		return rpc.PrefetchResult{}, errf(rpc.CodeInvalid, "device %d is not a served FUSE file (block %q, state %s)", p.ID, info.Block, info.State)
	}
	var n int64
	if p.Pack != "" {
		n, err = d.storePack(info, p.Pack)
	} else {
		n, err = d.files.Prefetch(info.Export, ranges)
	}
	if err != nil {
		return rpc.PrefetchResult{Stored: n}, fmt.Errorf("prefetch device %d: %w", p.ID, err)
	}
	return rpc.PrefetchResult{Stored: n}, nil
}

// storePack stores the pages of the working-set pack at path into the page
// cache of the FUSE file of device info, refusing a pack of a file of
// another size.
func (d *Daemon) storePack(info rpc.Device, path string) (int64, error) {
	f, pack, err := memsnap.ReadPackFile(path)
	if err != nil {
		return 0, errf(rpc.CodeInvalid, "%v", err)
	}
	defer f.Close()
	if pack.Size != info.Size {
		return 0, errf(rpc.CodeInvalid, "pack %s is of a %d-byte file, device %d is %d bytes", path, pack.Size, info.ID, info.Size)
	}
	copies := make([]memfs.Copy, len(pack.Extents))
	from := pack.DataOff
	for i, e := range pack.Extents {
		copies[i] = memfs.Copy{Off: e.Off, Len: e.Len, From: from}
		from += e.Len
	}
	return d.files.StoreFrom(info.Export, f, copies)
}
