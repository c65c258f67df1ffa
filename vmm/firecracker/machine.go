package firecracker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/firecracker-microvm/firecracker-go-sdk/client/models"

	"github.com/agentenv/agentenv/vmm"
)

// Machine is one Firecracker process. Besides vmm.Machine it offers the
// metadata service, the balloon and diff snapshots.
type Machine struct {
	d      *Driver
	id     string
	runDir string
	lay    *layout
	proc   *proc
	api    *client
	socket string // host path of the API socket

	console     string
	consoleFile *os.File
	memoryFile  string // set for restored machines

	createdRunDir bool
	owned         []string // files this machine created outside a run dir it created

	meta snapshotConfig // what the next snapshot's config.json says

	mu      sync.Mutex // serialises state changes
	paused  bool
	stopped bool
}

var (
	_ vmm.Machine     = (*Machine)(nil)
	_ DiffSnapshotter = (*Machine)(nil)
)

// DiffSnapshotter is implemented by machines that can write a snapshot
// holding only the memory pages written since the previous snapshot (or
// since boot or restore). Firecracker writes such a memory file sparse: the
// holes are pages to take from the parent snapshot's memory.
type DiffSnapshotter interface {
	SnapshotDiff(ctx context.Context, dir string) (*vmm.Snapshot, error)
}

func (m *Machine) log() *slog.Logger { return m.d.opts.Log }

// own records a file to delete on teardown.
func (m *Machine) own(path string) { m.owned = append(m.owned, path) }

// teardown kills the process (if any) and removes what this machine
// created. It serves both failed starts and Stop.
func (m *Machine) teardown() {
	if m.proc != nil {
		m.proc.kill()
	}
	if m.consoleFile != nil {
		_ = m.consoleFile.Close()
		m.consoleFile = nil
	}
	if m.lay != nil {
		m.lay.cleanup(m.d.opts.Jailer, instanceID(m.id))
	}
	for _, p := range m.owned {
		_ = os.Remove(p)
	}
	m.owned = nil
	if m.createdRunDir {
		_ = os.RemoveAll(m.runDir)
		m.createdRunDir = false
	}
}

// call runs one API call while the machine is up and blames a dead process
// for a failed call.
func (m *Machine) call(op string, fn func() error) error {
	if m.stopped {
		return fmt.Errorf("firecracker: %s %s: %w", op, m.id, vmm.ErrStopped)
	}
	if m.proc.exited() {
		return fmt.Errorf("firecracker: %s %s: %w: %v", op, m.id, vmm.ErrStopped, m.proc.exitError())
	}
	if err := fn(); err != nil {
		return fmt.Errorf("firecracker: %s %s: %w", op, m.id, m.proc.blame(err))
	}
	return nil
}

// Pause implements vmm.Machine.
func (m *Machine) Pause(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.paused && !m.stopped {
		return nil
	}
	err := m.call("pause", func() error { return m.api.patchVM(ctx, models.VMStatePaused) })
	if err == nil {
		m.paused = true
	}
	return err
}

// Resume implements vmm.Machine.
func (m *Machine) Resume(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.paused && !m.stopped {
		return nil
	}
	err := m.call("resume", func() error { return m.api.patchVM(ctx, models.VMStateResumed) })
	if err == nil {
		m.paused = false
	}
	return err
}

// Snapshot implements vmm.Machine with a Full snapshot.
func (m *Machine) Snapshot(ctx context.Context, dir string) (*vmm.Snapshot, error) {
	return m.snapshot(ctx, dir, "Full")
}

// SnapshotDiff implements DiffSnapshotter. It needs Options.TrackDirtyPages.
func (m *Machine) SnapshotDiff(ctx context.Context, dir string) (*vmm.Snapshot, error) {
	if !m.meta.TrackDirtyPages {
		return nil, fmt.Errorf("firecracker: diff snapshot %s: dirty page tracking is off (Options.TrackDirtyPages): %w", m.id, vmm.ErrUnsupported)
	}
	return m.snapshot(ctx, dir, "Diff")
}

// Info implements vmm.Machine.
func (m *Machine) Info() vmm.Info {
	return vmm.Info{
		Driver:        Name,
		PID:           m.proc.pid(),
		ControlSocket: m.socket,
		RunDir:        m.runDir,
		ConsoleLog:    m.console,
		Accel:         "kvm",
		MemoryFile:    m.memoryFile,
	}
}

// Stop implements vmm.Machine. The guest gets no chance to shut down: its
// state is either in a snapshot already or meant to be discarded.
func (m *Machine) Stop(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return nil
	}
	m.stopped = true
	m.teardown()
	m.log().Info("firecracker: stopped", "id", m.id)
	return nil
}

// Wait implements vmm.Machine. It returns nil when the process was ended by
// Stop or exited with status 0 (the guest rebooted or shut down), and the
// exit status with Firecracker's last stderr lines otherwise.
func (m *Machine) Wait(ctx context.Context) error {
	select {
	case <-m.proc.done:
	case <-ctx.Done():
		return fmt.Errorf("firecracker: wait %s: %w", m.id, ctx.Err())
	}
	if m.proc.wasKilled() || m.proc.err == nil {
		return nil
	}
	return fmt.Errorf("firecracker: machine %s: %w", m.id, m.proc.exitError())
}

// PutMetadata replaces the MMDS data store with data (a JSON object).
func (m *Machine) PutMetadata(ctx context.Context, data any) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.call("put metadata", func() error { return m.api.putMMDS(ctx, data) })
}

// PatchMetadata merges data into the MMDS data store (JSON merge patch).
func (m *Machine) PatchMetadata(ctx context.Context, data any) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.call("patch metadata", func() error { return m.api.patchMMDS(ctx, data) })
}

// Metadata returns the MMDS data store.
func (m *Machine) Metadata(ctx context.Context) (any, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out any
	err := m.call("get metadata", func() (err error) { out, err = m.api.getMMDS(ctx); return err })
	return out, err
}

// SetBalloon changes the balloon's target size; the machine must have been
// booted with Options.Balloon.
func (m *Machine) SetBalloon(ctx context.Context, amountMiB int64) error {
	if amountMiB < 0 {
		return fmt.Errorf("firecracker: balloon %s: negative size %d MiB", m.id, amountMiB)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.call("set balloon", func() error { return m.api.patchBalloon(ctx, amountMiB) })
}

// BalloonStats returns the balloon's statistics (enabled by a non-zero
// BalloonOptions.StatsPollingIntervalS).
func (m *Machine) BalloonStats(ctx context.Context) (*models.BalloonStats, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out *models.BalloonStats
	err := m.call("balloon stats", func() (err error) { out, err = m.api.balloonStats(ctx); return err })
	return out, err
}

// State asks Firecracker for the instance state ("Not started", "Running",
// "Paused").
func (m *Machine) State(ctx context.Context) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var state string
	err := m.call("describe", func() error {
		info, err := m.api.describe(ctx)
		if err != nil {
			return err
		}
		if info.State == nil {
			return errors.New("instance info without state")
		}
		state = *info.State
		return nil
	})
	return state, err
}

// FlushMetrics asks Firecracker to write its metrics now rather than at the
// next periodic flush (Options.Metrics).
func (m *Machine) FlushMetrics(ctx context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.call("flush metrics", func() error {
		return m.api.action(ctx, models.InstanceActionInfoActionTypeFlushMetrics)
	})
}

// Shutdown asks the guest to reboot (Ctrl-Alt-Del, x86 only), which ends a
// Firecracker guest booted with reboot=k, waits for the VMM to exit until
// ctx ends, then stops the machine either way. Unlike Stop it lets the guest
// flush its disks.
func (m *Machine) Shutdown(ctx context.Context) error {
	m.mu.Lock()
	err := m.call("shutdown", func() error {
		return m.api.action(ctx, models.InstanceActionInfoActionTypeSendCtrlAltDel)
	})
	m.mu.Unlock()
	if err == nil {
		select {
		case <-m.proc.done:
		case <-ctx.Done():
			err = fmt.Errorf("firecracker: shutdown %s: guest still running: %w", m.id, ctx.Err())
		}
	}
	return errors.Join(err, m.Stop(context.Background()))
}
