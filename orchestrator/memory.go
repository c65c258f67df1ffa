package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/agentenv/agentenv/vmm"
)

// MemoryImage names a layered guest memory image: its sealed LSMT layers,
// bottom first, and the file they flatten to, which VMs map privately.
type MemoryImage struct {
	Layers []string `json:"layers,omitempty"`
	File   string   `json:"file,omitempty"`
}

// memoryManifest is the file in a VMM snapshot directory that says its
// memory is layered (absent: the snapshot's own memory file is the image).
const memoryManifest = "memory.json"

func readMemoryManifest(vmDir string) (MemoryImage, error) {
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

func writeMemoryManifest(vmDir string, m MemoryImage) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(vmDir, memoryManifest)
	if err := os.WriteFile(path+".tmp", b, 0o600); err != nil {
		return fmt.Errorf("write memory manifest %s: %w", path, err)
	}
	return os.Rename(path+".tmp", path)
}

// captureMemory (VM paused) writes the VM's snapshot into dir.
func (o *Orchestrator) captureMemory(ctx context.Context, s *sandbox, vm vmm.Machine, dir string) error {
	if _, err := vm.Snapshot(ctx, dir); err != nil {
		return fmt.Errorf("vm snapshot: %w", err)
	}
	return nil
}
