package catalog

import (
	"os"
	"path/filepath"
	"sync"

	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/template"
	"github.com/agentenv/agentenv/vmm"
)

// PooledBase returns the template whose pooled VMs map the memory file a
// VM restored from vmDir maps: the template's memory file, with the
// layers above it written in. False when vmDir's memory is flattened into
// a file of its own (the restore maps that one) or stacks on no
// template's file. mu orders the look against memory imports and
// materializations.
func (c *Catalog) PooledBase(vmDir string, mu sync.Locker) (*template.Template, bool) {
	m, err := snapshot.ReadMemoryManifest(vmDir)
	if err != nil || !m.Layered() || len(m.Layers) < 2 || m.Base == "" {
		return nil, false
	}
	mu.Lock()
	_, flatErr := os.Stat(m.File)
	_, baseErr := os.Stat(m.Base)
	mu.Unlock()
	if flatErr == nil || baseErr != nil {
		return nil, false
	}
	// ensureMemoryBase: a template's memory file is its snapshot's.
	return c.Find(func(t *template.Template) bool {
		return m.Base == filepath.Join(t.Snapshot, vmm.SnapshotMemoryFile)
	})
}
