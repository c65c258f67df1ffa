package snapshot

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/agentenv/agentenv/internal/atomicfile"
)

// Guest memory is layered: a template's memory file is imported once as a
// sealed base layer; a VM restored from a memory image maps its flattened
// file privately, so the pages it writes are its own anonymous pages, and a
// pause or snapshot captures exactly those as one more sealed layer next to
// a VM state without RAM. The next restore maps the base file with the
// layers above it written in, or (without a base) the stack flattened once
// into the snapshot's memory file, shared by every VM restored from it.
// When the VMM cannot write state without RAM, or the VM was not restored
// from a layered image, the VMM's own snapshot carries the memory whole and
// there is no manifest.

// MemoryImage names a layered guest memory image: its sealed LSMT layers,
// bottom first, and the file they flatten to, which VMs map privately.
//
// Base, when set, is a file equal to the bottom layer alone (the template's
// memory file, immutable while the template lives). A restore may map it
// and have the layers above written into the VM's private copy instead of
// flattening the stack into File: the cost is the size of those layers, not
// of guest RAM. For a running VM's image, File is the file it maps.
type MemoryImage struct {
	Layers []string `json:"layers,omitempty"`
	File   string   `json:"file,omitempty"`
	Base   string   `json:"base,omitempty"`
}

// Layered reports whether m names a layered image (else the VMM snapshot's
// own memory file is the image).
func (m MemoryImage) Layered() bool { return len(m.Layers) > 0 && m.File != "" }

// memoryManifest is the file in a VMM snapshot directory that says its
// memory is layered (absent: the snapshot's own memory file is the image).
const memoryManifest = "memory.json"

// FlatMemory is the flattened layered image in a snapshot directory (not
// the VMM's own "memory" file, which may be the image the VM started from).
const FlatMemory = "memory.flat"

// WorkingSetFile is, in a snapshot directory with a layered memory image,
// the working set of the image's layer stack (memsnap's format): the pages
// the VM held when it was captured, or those the first VM restored from
// the stack touched until its agent answered. It is a hint: the upload of
// the snapshot commits its pages as a pack (WorkingSetPackFile), and a node
// restoring the stack from layers it lacks has them pushed into the page
// cache ahead of the guest.
const WorkingSetFile = "memory.workingset"

// WorkingSetPackFile is, in a snapshot directory brought from the
// repository with its memory layers read lazily, the pack of the stack's
// working set (memsnap's format: the working set and its pages' bytes), as
// the manifest committed it: the restore pushes those bytes into the page
// cache without reading the layers.
const WorkingSetPackFile = "memory.workingset.pack"

// ReadMemoryManifest reads the layered memory image of the VMM snapshot
// directory vmDir; an error wrapping os.ErrNotExist when it has none.
func ReadMemoryManifest(vmDir string) (MemoryImage, error) {
	var m MemoryImage
	b, err := os.ReadFile(filepath.Join(vmDir, memoryManifest))
	if err != nil {
		return m, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("memory manifest of %s: %w", vmDir, err)
	}
	return m, nil
}

// WriteMemoryManifest records m as vmDir's memory image, atomically.
func WriteMemoryManifest(vmDir string, m MemoryImage) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(vmDir, memoryManifest), b, 0o600); err != nil {
		return fmt.Errorf("write memory manifest of %s: %w", vmDir, err)
	}
	return nil
}

// AdoptMemory rewrites the manifest of a VMM snapshot directory copied from
// owner's into vmDir: layers under owner are hard-linked into dir, and the
// flattened file is vmDir's own.
func AdoptMemory(vmDir, owner, dir string) error {
	m, err := ReadMemoryManifest(vmDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if m.Layers, err = AdoptLayers(m.Layers, owner, dir); err != nil {
		return err
	}
	m.File = filepath.Join(vmDir, FlatMemory)
	return WriteMemoryManifest(vmDir, m)
}
