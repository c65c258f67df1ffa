// Package snapshot owns what a capture of a VM leaves on disk and the
// records that describe it: a snapshot's persisted record and its lookup by
// id or name, the layered guest memory image (memory.go) and the layer
// files of root disks (layers.go): image configs, hard-linked adoption of
// sealed layers, merges. The operations that take a snapshot of a running
// sandbox belong to the orchestrator, which owns the sandbox's state; the
// repository of snapshots in object storage is package snapshot/repo.
//
// On disk a snapshot is data_dir/snapshots/<id>: vm/ (the VMM snapshot:
// state, config, memory image and memory.json when memory is layered),
// rootfs.json + the sealed layers that lived in the sandbox's directory
// (hard links, so killing the sandbox keeps them), or rootfs.ext4 in file
// mode.
package snapshot

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"time"

	"github.com/agentenv/agentenv/internal/errdefs"
	"github.com/agentenv/agentenv/store"
)

// Record is the persisted description of a snapshot.
type Record struct {
	ID          string    `json:"id"`
	Names       []string  `json:"names"`
	SandboxID   string    `json:"sandboxID"`
	TemplateID  string    `json:"templateID"`
	CreatedAt   time.Time `json:"createdAt"`
	Dir         string    `json:"dir"`
	VM          string    `json:"vm"`                    // the VMM snapshot directory
	RootfsImage string    `json:"rootfsImage,omitempty"` // daemon mode
	Rootfs      string    `json:"rootfs,omitempty"`      // file mode
	VCPUs       int       `json:"vcpus"`
	MemoryMiB   int       `json:"memoryMiB"`
	// MemoryTargetMiB is the resize target of the sandbox when it was
	// taken (sandbox.Record's): its guest runs on that much of MemoryMiB,
	// and so do the sandboxes created from it. 0: not resized.
	MemoryTargetMiB int    `json:"memoryTargetMiB,omitempty"`
	DiskMiB         int    `json:"diskMiB"`
	EnvdVersion     string `json:"envdVersion"`
	// GuestToken is the access token the snapshot's agent holds (its
	// sandbox's): sandboxes created from it present it at their first /init.
	GuestToken string `json:"guestToken,omitempty"`
	// Hidden snapshots (taken for a fork) are not listed.
	Hidden bool `json:"hidden,omitempty"`
	// DriveSlots is how many drive slots the VM snapshot has; Drives are
	// the drives in them (drives.go).
	DriveSlots int     `json:"driveSlots,omitempty"`
	Drives     []Drive `json:"drives,omitempty"`
}

// LayerCounts reports how many memory and rootfs layers the snapshot has
// (memory 1 when its memory is one whole file, rootfs 1 in file mode).
func (r Record) LayerCounts() (memory, rootfs int) {
	memory, rootfs = 1, 1
	if m, err := ReadMemoryManifest(r.VM); err == nil && len(m.Layers) > 0 {
		memory = len(m.Layers)
	}
	if l := Refs(r.RootfsImage); len(l) > 0 {
		rootfs = len(l)
	}
	return memory, rootfs
}

// ValidName matches the names snapshots (and templates) may carry.
var ValidName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9._-]{0,127}$`)

// Get returns a snapshot by id or name.
func Get(st *store.Store, idOrName string) (Record, error) {
	var r Record
	if err := st.Get(store.Snapshots, idOrName, &r); err == nil {
		return r, nil
	}
	all, err := store.ListAll[Record](st, store.Snapshots)
	if err != nil {
		return r, fmt.Errorf("snapshot %q: %w", idOrName, err)
	}
	for _, s := range all {
		if slices.Contains(s.Names, idOrName) {
			return s, nil
		}
	}
	return r, fmt.Errorf("snapshot %q: %w", idOrName, errdefs.ErrNotFound)
}

// List returns the visible snapshots, newest first, optionally only those
// of one sandbox or carrying one name.
func List(st *store.Store, sandboxID, name string) ([]Record, error) {
	all, err := store.ListAll[Record](st, store.Snapshots)
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	out := all[:0]
	for _, s := range all {
		if s.Hidden || (sandboxID != "" && s.SandboxID != sandboxID) || (name != "" && !slices.Contains(s.Names, name)) {
			continue
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.After(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}
