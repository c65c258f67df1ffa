// Package memsnap captures guest memory as LSMT memory layers and materializes
// layer stacks into files VMs map privately.
//
// A VM restored from a memory image maps that image MAP_PRIVATE, so every page
// the guest writes becomes an anonymous copy-on-write page of the VMM process
// while untouched pages stay shared in the host page cache. CaptureDiff reads
// exactly those pages (found through /proc/<pid>/pagemap, read with
// process_vm_readv) into a sealed layer on top of the image's top layer;
// ImportFull turns the shared RAM file of a freshly booted VM into a base
// layer; Materialize flattens a stack of such layers back into a sparse file
// for the next VM to map, or WriteLayers writes the layers above a stack's
// bottom file into a VMM that maps that file (no flattened copy); Merge
// compacts a long chain. Layers are the overlaybd LSMT format (storage/lsmt).
//
// The cycle of a sandbox:
//
//	ImportFull(booted VM's RAM file)            -> L0 (base, no parent)
//	Materialize([L0], F0); VM maps F0 privately
//	pause: CaptureDiff(pid, F0, L1, uuid(L0))   -> L1
//	Materialize([L0, L1], F1); next VM maps F1 privately
//	pause: CaptureDiff(pid, F1, L2, uuid(L1))   -> L2, and so on
//
// or, without flattened files (the base F0 mapped by every VM):
//
//	VM maps F0 privately; WriteLayers(pid, F0, [L1]) before it runs
//	pause: CaptureDiff(pid, F0, L2, uuid(L1))   -> L2 (holds L1's pages too)
//
// Output files hold guest memory and are created 0600.
package memsnap

import (
	"fmt"
	"os"
	"time"

	"github.com/agentenv/agentenv/internal/atomicfile"

	"github.com/agentenv/agentenv/storage/lsmt"
)

// Stats describe a written memory layer.
type Stats struct {
	Pages     int64         // data pages written
	ZeroPages int64         // pages written as zeroed extents
	Bytes     int64         // layer file size
	Took      time.Duration // wall time of the whole operation
}

// LayerUUID returns the UUID of a sealed layer (for the parent of the next diff).
func LayerUUID(path string) (lsmt.UUID, error) {
	l, err := lsmt.OpenLayerFile(path)
	if err != nil {
		return lsmt.UUID{}, fmt.Errorf("layer uuid: %w", err)
	}
	defer l.Close()
	return l.UUID(), nil
}

// pageSize is the host's base page size: the unit of pagemap entries.
var pageSize = os.Getpagesize()

// writeLayer writes the sealed layer out atomically: fill hands its extents
// to the writer; st.Bytes gets the file's size. On any error nothing is left
// under out.
func writeLayer(out string, opt lsmt.SealOptions, st *Stats, fill func(*lsmt.ExtentWriter) error) error {
	af, err := atomicfile.Create(out, 0o600) // guest memory: private to its owner
	if err != nil {
		return err
	}
	xw, err := lsmt.NewExtentWriter(af, opt)
	if err != nil {
		af.Abort()
		return err
	}
	if err := fill(xw); err != nil {
		af.Abort()
		return err
	}
	res, err := xw.Close()
	if err != nil {
		af.Abort()
		return err
	}
	if err := af.Commit(); err != nil {
		return err
	}
	st.Bytes = res.FileSize
	return nil
}

// isZero reports whether b is all zero bytes.
func isZero(b []byte) bool {
	for len(b) >= len(zeroPage) {
		if string(b[:len(zeroPage)]) != string(zeroPage[:]) {
			return false
		}
		b = b[len(zeroPage):]
	}
	return string(b) == string(zeroPage[:len(b)])
}

var zeroPage [64 << 10]byte
