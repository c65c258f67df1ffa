package qemu

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/agentenv/agentenv/vmm"
)

var (
	_ vmm.Preparer = (*Driver)(nil)
	_ vmm.Prepared = (*machine)(nil)
)

// Prepare implements vmm.Preparer: QEMU starts as a restore's does (with
// -incoming defer and the vCPUs stopped), devices open and the memory file
// mapped, and waits for Load. A restore is exactly Prepare then Load.
func (d *Driver) Prepare(ctx context.Context, rc vmm.RestoreConfig) (vmm.Prepared, error) {
	m, err := d.prepare(ctx, rc)
	if err != nil {
		return nil, err
	}
	return m, nil
}

// Load implements vmm.Prepared.
func (m *machine) Load(ctx context.Context, snapshotDir string, layers []string, paused bool) error {
	if err := m.alive(); err != nil {
		return err
	}
	spec, err := readSpec(snapshotDir)
	if err != nil {
		return err
	}
	if why := sameMachine(m.spec, spec); why != "" {
		return fmt.Errorf("load %s into vm %s: not a snapshot of the machine it was prepared as: %s", snapshotDir, m.id, why)
	}
	if err := m.load(ctx, snapshotDir, layers, !paused); err != nil {
		return fmt.Errorf("load %s into vm %s: %w", snapshotDir, m.id, err)
	}
	return nil
}

// sameMachine says why a snapshot's spec s cannot load into a machine
// running spec m ("" when it can): everything but the devices' backing
// (a restore's own disks and taps) must be the same.
func sameMachine(m, s *machineSpec) string {
	switch {
	case m.Version != s.Version:
		return fmt.Sprintf("spec version %d vs %d", m.Version, s.Version)
	case m.Kernel != s.Kernel || m.Initrd != s.Initrd || m.Cmdline != s.Cmdline:
		return "kernel, initrd or command line differ"
	case m.VCPUs != s.VCPUs || m.MemoryMiB != s.MemoryMiB || m.Accel != s.Accel:
		return fmt.Sprintf("%d vCPUs %d MiB %s vs %d vCPUs %d MiB %s", m.VCPUs, m.MemoryMiB, m.Accel, s.VCPUs, s.MemoryMiB, s.Accel)
	case !slices.EqualFunc(m.Drives, s.Drives, func(a, b vmm.Drive) bool { return a.ID == b.ID }):
		return "drive slots differ"
	case !slices.Equal(m.NICs, s.NICs):
		return "network interfaces differ"
	}
	return ""
}

// Move implements vmm.Prepared. QEMU holds its run directory's files as
// descriptors (QMP socket, console, memory file), so a rename does not
// disturb it; the machine record is rewritten with the new paths for a
// later Adopt.
func (m *machine) Move(dir string) error {
	if err := m.alive(); err != nil {
		return err
	}
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("move vm %s to %s: the directory exists or cannot be checked (%v)", m.id, dir, err)
	}
	m.stopConsoleCap() // it reads the console's path
	defer m.startConsoleCap()
	old := m.rd.dir
	if err := os.Rename(old, dir); err != nil {
		return fmt.Errorf("move vm %s: %w", m.id, err)
	}
	rebase := func(p string) string {
		if rel, err := filepath.Rel(old, p); err == nil && !strings.HasPrefix(rel, "..") {
			return filepath.Join(dir, rel)
		}
		return p
	}
	m.rd.dir, m.rd.console = dir, rebase(m.rd.console)
	owned := make([]string, 0, len(m.rd.owned))
	for _, p := range m.rd.owned {
		if p = rebase(p); p != m.rd.path(recordFile) { // saveRecord names it again
			owned = append(owned, p)
		}
	}
	m.rd.owned = owned
	if err := m.saveRecord(); err != nil {
		return fmt.Errorf("move vm %s: %w", m.id, err)
	}
	m.log.Debug("run directory moved", "from", old, "to", dir)
	return nil
}
