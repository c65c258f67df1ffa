package firecracker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/agentenv/agentenv/internal/atomicfile"

	"github.com/firecracker-microvm/firecracker-go-sdk/client/models"

	"github.com/agentenv/agentenv/vmm"
)

// configFormat versions config.json.
const configFormat = 1

// snapshotConfig is config.json in a snapshot directory: what Restore needs
// besides Firecracker's own state file (which records devices by the paths
// the VMM saw, VMPath).
type snapshotConfig struct {
	Driver          string      `json:"driver"`
	Format          int         `json:"format"`
	Type            string      `json:"type"` // Full or Diff
	VCPUs           int         `json:"vcpus"`
	MemoryMiB       int         `json:"memory_mib"`
	Kernel          string      `json:"kernel,omitempty"`
	Initrd          string      `json:"initrd,omitempty"`
	Cmdline         string      `json:"cmdline,omitempty"`
	Jailed          bool        `json:"jailed"`
	TrackDirtyPages bool        `json:"track_dirty_pages"`
	Drives          []snapDrive `json:"drives"`
	NICs            []snapNIC   `json:"nics"`
}

type snapDrive struct {
	ID       string `json:"id"`
	Path     string `json:"path"`    // host path at snapshot time
	VMPath   string `json:"vm_path"` // the path Firecracker's state names
	ReadOnly bool   `json:"read_only"`
}

type snapNIC struct {
	ID      string `json:"id"`
	MAC     string `json:"mac"`
	TapName string `json:"tap_name"`
}

func (m *Machine) snapshot(ctx context.Context, dir, kind string) (*vmm.Snapshot, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return nil, fmt.Errorf("firecracker: snapshot %s: %w", m.id, vmm.ErrStopped)
	}
	if !m.paused {
		return nil, fmt.Errorf("firecracker: snapshot %s: %w", m.id, vmm.ErrNotPaused)
	}
	if err := absPaths(&dir); err != nil {
		return nil, fmt.Errorf("firecracker: snapshot %s: %w", m.id, err)
	}
	start := time.Now()
	snap, err := m.writeSnapshot(ctx, dir, kind)
	if err != nil {
		return nil, fmt.Errorf("firecracker: snapshot %s to %s: %w", m.id, dir, err)
	}
	snap.Took = time.Since(start)
	m.log().Info("firecracker: snapshot", "id", m.id, "dir", dir, "type", kind, "took", snap.Took)
	return snap, nil
}

func (m *Machine) writeSnapshot(ctx context.Context, dir, kind string) (snap *vmm.Snapshot, err error) {
	_, statErr := os.Stat(dir)
	createdDir := errors.Is(statErr, os.ErrNotExist)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	state := filepath.Join(dir, vmm.SnapshotStateFile)
	memory := filepath.Join(dir, vmm.SnapshotMemoryFile)
	defer func() {
		// A half-written snapshot must not pass for one.
		if err == nil {
			return
		}
		for _, p := range []string{state, memory, filepath.Join(dir, vmm.SnapshotConfigFile)} {
			_ = os.Remove(p)
		}
		if m.lay.jailed {
			_ = os.Remove(m.lay.hostPath("snapshot-state"))
			_ = os.Remove(m.lay.hostPath("snapshot-memory"))
		}
		if createdDir {
			_ = os.Remove(dir)
		}
	}()
	for _, p := range []string{state, memory} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	}
	// Under the jailer Firecracker writes inside its chroot; collect moves
	// the files out.
	vmState, vmMemory := state, memory
	if m.lay.jailed {
		vmState, vmMemory = "/snapshot-state", "/snapshot-memory"
	}
	sp := &models.SnapshotCreateParams{SnapshotPath: &vmState, MemFilePath: &vmMemory, SnapshotType: kind}
	if err := m.call("snapshot", func() error { return m.api.createSnapshot(ctx, sp) }); err != nil {
		return nil, err
	}
	if err := m.lay.collect("snapshot-state", state); err != nil {
		return nil, err
	}
	if err := m.lay.collect("snapshot-memory", memory); err != nil {
		return nil, err
	}
	meta := m.meta
	meta.Type = kind
	if err := writeConfig(filepath.Join(dir, vmm.SnapshotConfigFile), meta); err != nil {
		return nil, err
	}
	st, err := os.Stat(state)
	if err != nil {
		return nil, fmt.Errorf("state file: %w", err)
	}
	mt, err := os.Stat(memory)
	if err != nil {
		return nil, fmt.Errorf("memory file: %w", err)
	}
	return &vmm.Snapshot{Dir: dir, StateFile: state, MemoryFile: memory, StateBytes: st.Size(), MemBytes: mt.Size()}, nil
}

// writeConfig writes config.json through a temporary file so a reader never
// sees half of it.
func writeConfig(path string, c snapshotConfig) error {
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(path, append(b, '\n'), 0o644)
}

// readConfig reads and checks config.json of a snapshot directory. The file
// may come from elsewhere, so every field used later is checked here.
func readConfig(dir string) (snapshotConfig, error) {
	var c snapshotConfig
	path := filepath.Join(dir, vmm.SnapshotConfigFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return c, err
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("%s: %w", path, err)
	}
	switch {
	case c.Driver != Name:
		return c, fmt.Errorf("%s: snapshot of driver %q, not %q", path, c.Driver, Name)
	case c.Format != configFormat:
		return c, fmt.Errorf("%s: format %d, want %d", path, c.Format, configFormat)
	case c.Type != "Full" && c.Type != "Diff":
		return c, fmt.Errorf("%s: snapshot type %q is not Full or Diff", path, c.Type)
	}
	seen := map[string]bool{}
	for _, d := range c.Drives {
		if d.ID == "" || d.VMPath == "" || seen["d:"+d.ID] {
			return c, fmt.Errorf("%s: drive %q: empty or repeated id or path", path, d.ID)
		}
		seen["d:"+d.ID] = true
	}
	for _, n := range c.NICs {
		if n.ID == "" || n.TapName == "" || seen["n:"+n.ID] {
			return c, fmt.Errorf("%s: nic %q: empty or repeated id or tap", path, n.ID)
		}
		seen["n:"+n.ID] = true
	}
	return c, nil
}

// Restore implements vmm.Driver.
func (d *Driver) Restore(ctx context.Context, cfg vmm.RestoreConfig) (vmm.Machine, error) {
	if cfg.RunAs != nil {
		return nil, errRunAs
	}
	m, err := d.restore(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("firecracker: restore %s from %s: %w", cfg.ID, cfg.SnapshotDir, err)
	}
	return m, nil
}

// restorePlan is what Restore derives from config.json and RestoreConfig
// before starting anything.
type restorePlan struct {
	meta      snapshotConfig
	state     string
	memory    string
	drives    []snapDrive // with Path set to the drive to use now
	patches   []snapDrive // drives to repoint after loading (direct mode)
	overrides []networkOverride
}

func (d *Driver) planRestore(cfg vmm.RestoreConfig) (*restorePlan, error) {
	if cfg.RunDir == "" {
		return nil, errors.New("RunDir is required")
	}
	if err := vmm.CheckDevices(cfg.Drives, cfg.NICs); err != nil {
		return nil, err
	}
	if err := checkFirecrackerDevices(cfg.Drives, cfg.NICs); err != nil {
		return nil, err
	}
	cfg.Drives = append([]vmm.Drive(nil), cfg.Drives...)
	if err := absPaths(&cfg.SnapshotDir, &cfg.MemoryFile); err != nil {
		return nil, err
	}
	for i := range cfg.Drives {
		if err := absPaths(&cfg.Drives[i].Path); err != nil {
			return nil, err
		}
	}
	meta, err := readConfig(cfg.SnapshotDir)
	if err != nil {
		return nil, err
	}
	if meta.Jailed != (d.opts.Jailer != nil) {
		return nil, fmt.Errorf("snapshot taken with jailer=%v cannot be restored with jailer=%v: Firecracker's state names the drives by the paths it saw", meta.Jailed, d.opts.Jailer != nil)
	}
	if meta.Type == "Diff" && cfg.MemoryFile == "" {
		return nil, errors.New("diff snapshot: its memory file holds only the pages written since the previous snapshot; merge it onto the parent's memory image and pass that as MemoryFile")
	}
	p := &restorePlan{meta: meta, state: filepath.Join(cfg.SnapshotDir, vmm.SnapshotStateFile), memory: cfg.MemoryFile}
	if p.memory == "" {
		p.memory = filepath.Join(cfg.SnapshotDir, vmm.SnapshotMemoryFile)
	}
	for what, path := range map[string]string{"state file": p.state, "memory file": p.memory} {
		if st, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		} else if !st.Mode().IsRegular() {
			return nil, fmt.Errorf("%s %s: not a regular file", what, path)
		}
	}
	if err := p.planDrives(cfg.Drives, meta.Jailed); err != nil {
		return nil, err
	}
	return p, p.planNICs(cfg.NICs)
}

func (p *restorePlan) planDrives(repl []vmm.Drive, jailed bool) error {
	byID := map[string]vmm.Drive{}
	for _, d := range repl {
		byID[d.ID] = d
	}
	for _, sd := range p.meta.Drives {
		r, ok := byID[sd.ID]
		delete(byID, sd.ID)
		cur := sd
		if ok {
			cur.Path = r.Path
			if r.ReadOnly != sd.ReadOnly {
				return fmt.Errorf("drive %s: read-only=%v differs from the snapshot's %v", sd.ID, r.ReadOnly, sd.ReadOnly)
			}
		}
		if !jailed {
			// Firecracker reopens the snapshot-time path while loading; a
			// different drive is swapped in afterwards.
			if _, err := os.Stat(sd.VMPath); err != nil {
				return fmt.Errorf("drive %s: Firecracker reopens the snapshot-time path while loading (run with the jailer for relocatable drives): %w", sd.ID, err)
			}
			if cur.Path != sd.VMPath {
				p.patches = append(p.patches, cur)
			}
		}
		p.drives = append(p.drives, cur)
	}
	for id := range byID {
		return fmt.Errorf("drive %s is not in the snapshot", id)
	}
	return nil
}

func (p *restorePlan) planNICs(repl []vmm.NIC) error {
	byID := map[string]vmm.NIC{}
	for _, n := range repl {
		byID[n.ID] = n
	}
	for _, sn := range p.meta.NICs {
		r, ok := byID[sn.ID]
		delete(byID, sn.ID)
		if !ok {
			continue
		}
		if r.MAC != "" && !sameMAC(r.MAC, sn.MAC) {
			return fmt.Errorf("nic %s: MAC %s differs from the snapshot's %s; the guest keeps its MAC", sn.ID, r.MAC, sn.MAC)
		}
		if r.TapName != sn.TapName {
			p.overrides = append(p.overrides, networkOverride{IfaceID: sn.ID, HostDevName: r.TapName})
		}
	}
	for id := range byID {
		return fmt.Errorf("nic %s is not in the snapshot", id)
	}
	return nil
}

func sameMAC(a, b string) bool {
	x, errA := vmm.ParseMAC(a)
	y, errB := vmm.ParseMAC(b)
	return errA == nil && errB == nil && x.String() == y.String()
}

func (d *Driver) restore(ctx context.Context, cfg vmm.RestoreConfig) (*Machine, error) {
	plan, err := d.planRestore(cfg)
	if err != nil {
		return nil, err
	}
	if err := absPaths(&cfg.RunDir, &cfg.ConsoleLog); err != nil {
		return nil, err
	}
	m, err := d.launch(ctx, cfg.ID, cfg.RunDir, cfg.ConsoleLog, cfg.NetNS)
	if err != nil {
		return nil, err
	}
	if err := m.load(ctx, plan, cfg.Paused); err != nil {
		err = m.proc.blame(err)
		m.teardown()
		return nil, err
	}
	m.log().Info("firecracker: restored", "id", cfg.ID, "pid", m.proc.pid(), "snapshot", cfg.SnapshotDir, "memory", plan.memory, "paused", cfg.Paused)
	return m, nil
}

// load exposes the snapshot files (and, jailed, the drives under their
// stable names), loads the snapshot with the File memory backend, which
// Firecracker maps MAP_PRIVATE, repoints drives and resumes.
func (m *Machine) load(ctx context.Context, p *restorePlan, paused bool) error {
	state, err := m.lay.expose(p.state, "state", false)
	if err != nil {
		return err
	}
	memory, err := m.lay.expose(p.memory, "memory", false)
	if err != nil {
		return err
	}
	for _, dr := range p.drives {
		if _, err := m.lay.expose(dr.Path, "drive-"+dr.ID, !dr.ReadOnly); err != nil {
			return err
		}
	}
	backend := models.MemoryBackendBackendTypeFile
	resume := !paused && len(p.patches) == 0
	lp := loadParams{
		SnapshotLoadParams: &models.SnapshotLoadParams{
			SnapshotPath:        &state,
			MemBackend:          &models.MemoryBackend{BackendType: &backend, BackendPath: &memory},
			EnableDiffSnapshots: m.d.opts.TrackDirtyPages,
			ResumeVM:            resume,
		},
		NetworkOverrides: p.overrides,
	}
	if err := m.api.loadSnapshot(ctx, lp); err != nil {
		return err
	}
	for _, dr := range p.patches {
		if err := m.api.patchDrive(ctx, dr.ID, dr.Path); err != nil {
			return err
		}
	}
	if !paused && !resume {
		if err := m.api.patchVM(ctx, models.VMStateResumed); err != nil {
			return err
		}
	}
	m.paused = paused
	m.memoryFile = p.memory
	m.meta = p.meta
	m.meta.TrackDirtyPages = m.d.opts.TrackDirtyPages
	m.meta.Drives = nil
	for _, dr := range p.drives {
		if !m.lay.jailed {
			dr.VMPath = dr.Path
		}
		m.meta.Drives = append(m.meta.Drives, dr)
	}
	for i, n := range m.meta.NICs {
		for _, o := range p.overrides {
			if o.IfaceID == n.ID {
				m.meta.NICs[i].TapName = o.HostDevName
			}
		}
	}
	return nil
}
