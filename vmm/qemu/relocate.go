package qemu

import (
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/vmm"
)

// RelocateSnapshot implements vmm.Relocator: the snapshot in dir, taken on
// another host, boots (and is restored) from the kernel and initrd the
// local snapshot reference names. The incoming state replaces guest RAM,
// so the files need only exist here; the machine's sizes must match.
func (d *Driver) RelocateSnapshot(dir, reference string) error {
	spec, err := readSpec(dir)
	if err != nil {
		return fmt.Errorf("relocate: %w", err)
	}
	ref, err := readSpec(reference)
	if err != nil {
		return fmt.Errorf("relocate: reference: %w", err)
	}
	if spec.VCPUs != ref.VCPUs || spec.MemoryMiB != ref.MemoryMiB {
		return fmt.Errorf("relocate %s: %d vCPUs and %d MiB, the reference %s has %d and %d",
			dir, spec.VCPUs, spec.MemoryMiB, reference, ref.VCPUs, ref.MemoryMiB)
	}
	spec.Kernel, spec.Initrd = ref.Kernel, ref.Initrd
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, vmm.SnapshotConfigFile), b, 0o600); err != nil {
		return fmt.Errorf("relocate %s: %w", dir, err)
	}
	return nil
}
