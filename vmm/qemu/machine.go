package qemu

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/agentenv/agentenv/vmm"
	"github.com/agentenv/agentenv/vmm/qemu/qmp"
)

// machine is one QEMU process.
type machine struct {
	id     string
	binary string // the QEMU executable, an absolute path
	spec   *machineSpec
	mem    memorySource
	rd     *runDir
	proc   *os.Process
	qmp    *qmp.Conn
	log    *slog.Logger
	tscKHz int // the host's TSC frequency (HostTSCkHz)

	exited  chan struct{}
	exitErr error
	// console is the console cap's goroutine (startConsoleCap); it ends
	// when the VMM does or this handle is detached, and the one who ends it
	// waits for it.
	consoleStop chan struct{}
	consoleDone chan struct{}

	stopOnce sync.Once
	stopErr  error
}

var _ vmm.Machine = (*machine)(nil)

// runDir tracks the files a machine owns so Stop can remove exactly them.
type runDir struct {
	dir     string
	created bool
	console string
	owned   []string
}

func newRunDir(dir, console string) (*runDir, error) {
	rd := &runDir{dir: dir}
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		rd.created = true
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("run dir %s: %w", dir, err)
	}
	rd.console = console
	if console == "" {
		rd.console = filepath.Join(dir, "console.log")
		rd.own(rd.console)
	}
	rd.own(rd.path("qmp.sock"), rd.path("qemu.log"), rd.path("qemu.log.1"))
	return rd, nil
}

func (rd *runDir) path(name string) string { return filepath.Join(rd.dir, name) }
func (rd *runDir) own(paths ...string)     { rd.owned = append(rd.owned, paths...) }

func (rd *runDir) cleanup() {
	for _, p := range rd.owned {
		_ = os.Remove(p)
	}
	if rd.created {
		_ = os.RemoveAll(rd.dir)
	}
}

// start launches QEMU and connects QMP. On error nothing is left behind.
func (d *Driver) start(ctx context.Context, id string, spec *machineSpec, mem memorySource, taps []*os.File, rd *runDir, incoming bool) (*machine, error) {
	logFile, err := openVMMLog(rd.path("qemu.log"))
	if err != nil {
		rd.cleanup()
		return nil, err
	}
	defer logFile.Close()
	jail := ""
	if spec.RunAs != nil {
		if jail, err = jailOf(spec, rd.dir, mem.path, rd.console); err != nil {
			rd.cleanup()
			return nil, err
		}
	}
	handed, err := openHanded(rd.path("qmp.sock"), rd.console, mem)
	if err != nil {
		rd.cleanup()
		return nil, err
	}
	defer handed.Close()
	files, fds := handed.extraFiles(taps)
	cmd, err := d.command(spec, buildArgs(spec, mem, fds, jail, incoming), jail)
	if err != nil {
		rd.cleanup()
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.ExtraFiles = files
	// Its own session: a VM outlives a restart of the node server and is
	// not hit by the terminal's signals.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		rd.cleanup()
		return nil, fmt.Errorf("start %s: %w", d.binary, err)
	}
	m := &machine{id: id, binary: d.binary, spec: spec, mem: mem, rd: rd, proc: cmd.Process, exited: make(chan struct{}),
		tscKHz: d.tscKHz, log: d.log.With("vm", id, "pid", cmd.Process.Pid)}
	go func() {
		m.exitErr = cmd.Wait()
		close(m.exited)
	}()
	m.startConsoleCap()
	if err := m.saveRecord(); err != nil {
		m.kill()
		rd.cleanup()
		return nil, err
	}
	if err := m.connect(ctx); err != nil {
		m.kill()
		rd.cleanup()
		return nil, err
	}
	m.log.Debug("qemu started", "accel", spec.Accel, "incoming", incoming)
	return m, nil
}

func (m *machine) connect(ctx context.Context) error {
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	go func() {
		select {
		case <-m.exited:
			cancel()
		case <-dctx.Done():
		}
	}()
	q, err := qmp.Dial(dctx, m.rd.path("qmp.sock"))
	if err != nil {
		// A QEMU that refuses its configuration closes the socket as it
		// exits: give the exit a moment to be seen, then report QEMU's words.
		select {
		case <-m.exited:
			return fmt.Errorf("qemu exited during start (%v): %s", m.exitErr, m.logTail())
		case <-time.After(2 * time.Second):
			return fmt.Errorf("qemu control socket: %w", err)
		}
	}
	m.qmp = q
	caps := map[string]any{"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": true}}}
	if err := q.Execute(ctx, "migrate-set-capabilities", caps, nil); err != nil {
		return fmt.Errorf("enable x-ignore-shared: %w", err)
	}
	// Snapshots migrate a paused VM into a local file or pipe: QEMU's
	// default bandwidth cap (128 MiB/s in 7.2, meant for live migration
	// over a network) only slows them down.
	params := map[string]any{"max-bandwidth": int64(migrationBandwidth)}
	if err := q.Execute(ctx, "migrate-set-parameters", params, nil); err != nil {
		return fmt.Errorf("set migration bandwidth: %w", err)
	}
	return nil
}

// migrationBandwidth is the migration bandwidth cap in bytes per second.
const migrationBandwidth = 64 << 30

// logTail is the end of QEMU's own output, for error messages.
func (m *machine) logTail() string {
	b, _ := os.ReadFile(m.rd.path("qemu.log"))
	b = bytes.TrimSpace(b)
	if len(b) > 1500 {
		b = b[len(b)-1500:]
	}
	if len(b) == 0 {
		return "(no output)"
	}
	return string(b)
}

func (m *machine) kill() {
	_ = m.proc.Kill()
	<-m.exited
	m.stopConsoleCap()
	if m.qmp != nil {
		m.qmp.Close()
	}
}

func (m *machine) alive() error {
	select {
	case <-m.exited:
		return fmt.Errorf("vm %s: %w (qemu: %v)", m.id, vmm.ErrStopped, m.exitErr)
	default:
		return nil
	}
}

func (m *machine) status(ctx context.Context) (string, error) {
	var st struct {
		Status string `json:"status"`
	}
	if err := m.qmp.Execute(ctx, "query-status", nil, &st); err != nil {
		return "", err
	}
	return st.Status, nil
}

// Pause implements vmm.Machine.
func (m *machine) Pause(ctx context.Context) error {
	if err := m.alive(); err != nil {
		return err
	}
	if err := m.qmp.Execute(ctx, "stop", nil, nil); err != nil {
		return fmt.Errorf("pause %s: %w", m.id, err)
	}
	return nil
}

// Resume implements vmm.Machine.
func (m *machine) Resume(ctx context.Context) error {
	if err := m.alive(); err != nil {
		return err
	}
	if err := m.qmp.Execute(ctx, "cont", nil, nil); err != nil {
		return fmt.Errorf("resume %s: %w", m.id, err)
	}
	return nil
}

// Snapshot implements vmm.Machine.
func (m *machine) Snapshot(ctx context.Context, dir string) (*vmm.Snapshot, error) {
	start := time.Now()
	if err := m.requirePaused(ctx, "snapshot"); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", m.id, err)
	}
	snap := &vmm.Snapshot{Dir: dir, StateFile: filepath.Join(dir, vmm.SnapshotStateFile), MemoryFile: filepath.Join(dir, vmm.SnapshotMemoryFile)}
	if err := m.saveState(ctx, snap.StateFile); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", m.id, err)
	}
	if err := m.saveMemory(snap.MemoryFile); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", m.id, err)
	}
	b, _ := json.MarshalIndent(m.spec, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, vmm.SnapshotConfigFile), b, 0o600); err != nil {
		return nil, fmt.Errorf("snapshot %s: %w", m.id, err)
	}
	if fi, err := os.Stat(snap.StateFile); err == nil {
		snap.StateBytes = fi.Size()
	}
	snap.MemBytes = int64(m.spec.MemoryMiB) << 20
	snap.Took = time.Since(start)
	m.log.Info("snapshot written", "dir", dir, "state_bytes", snap.StateBytes, "took", snap.Took.Round(time.Millisecond))
	return snap, nil
}

// saveState migrates the device state into path through a descriptor
// handed to QEMU (getfd), so QEMU opens nothing and runs no command.
func (m *machine) saveState(ctx context.Context, path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("state file: %w", err)
	}
	defer f.Close()
	if err := m.qmp.ExecuteWithFile(ctx, "getfd", map[string]any{"fdname": "aenv-state"}, f, nil); err != nil {
		return fmt.Errorf("pass state file: %w", err)
	}
	if err := m.qmp.Execute(ctx, "migrate", map[string]any{"uri": "fd:aenv-state"}, nil); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	return m.waitMigration(ctx)
}

func (m *machine) waitMigration(ctx context.Context) error {
	for {
		var info struct {
			Status string `json:"status"`
			Error  string `json:"error-desc"`
		}
		if err := m.qmp.Execute(ctx, "query-migrate", nil, &info); err != nil {
			return err
		}
		switch info.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			return fmt.Errorf("migration %s: %s", info.Status, info.Error)
		}
		select {
		case <-ctx.Done():
			_ = m.qmp.Execute(context.WithoutCancel(ctx), "migrate_cancel", nil, nil)
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// saveMemory puts the guest memory image next to the state. A cold-booted
// machine's RAM lives in its shared memory file: copy it, sparsely. A
// restored machine maps its image privately, so its RAM went into the state
// stream and the image underneath only has to be there again.
func (m *machine) saveMemory(dst string) error {
	if m.mem.shared {
		_, err := sparseCopy(m.mem.path, dst)
		return err
	}
	if sameFile(m.mem.path, dst) {
		return nil
	}
	return linkOrCopy(m.mem.path, dst)
}

func sameFile(a, b string) bool {
	sa, err1 := os.Stat(a)
	sb, err2 := os.Stat(b)
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}

// loadState feeds a saved state into a QEMU started with -incoming defer.
func (m *machine) loadState(ctx context.Context, state *os.File, run bool) error {
	if err := m.qmp.ExecuteWithFile(ctx, "getfd", map[string]any{"fdname": "aenv-state"}, state, nil); err != nil {
		return fmt.Errorf("pass state file: %w", err)
	}
	if err := m.qmp.Execute(ctx, "migrate-incoming", map[string]any{"uri": "fd:aenv-state"}, nil); err != nil {
		return fmt.Errorf("load state: %w", err)
	}
	for {
		st, err := m.status(ctx)
		if err != nil {
			if m.alive() != nil {
				return fmt.Errorf("load state: qemu exited: %s", m.logTail())
			}
			return fmt.Errorf("load state: %w", err)
		}
		if st != "inmigrate" {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
	if !run {
		return nil
	}
	return m.Resume(ctx)
}

// Stop implements vmm.Machine: QMP quit, then SIGKILL if QEMU lingers.
func (m *machine) Stop(ctx context.Context) error {
	m.stopOnce.Do(func() {
		if m.alive() == nil {
			qctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			_ = m.qmp.Execute(qctx, "quit", nil, nil)
			cancel()
			select {
			case <-m.exited:
			case <-time.After(5 * time.Second):
				m.log.Warn("qemu did not quit; killing")
			}
		}
		m.kill()
		m.rd.cleanup()
	})
	return m.stopErr
}

// Wait implements vmm.Machine.
func (m *machine) Wait(ctx context.Context) error {
	select {
	case <-m.exited:
		if m.exitErr != nil {
			return fmt.Errorf("vm %s: qemu: %w", m.id, m.exitErr)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// hostTSC is the host TSC frequency the guest's TSC follows: under TCG
// only (under KVM the guest's kvm-clock is kept right by the host).
func (m *machine) hostTSC() int {
	if m.spec.Accel != "tcg" {
		return 0
	}
	return m.tscKHz
}

// Info implements vmm.Machine.
func (m *machine) Info() vmm.Info {
	return vmm.Info{Driver: "qemu", PID: m.proc.Pid, ControlSocket: m.rd.path("qmp.sock"), RunDir: m.rd.dir,
		ConsoleLog: m.rd.console, Accel: m.spec.Accel, MemoryFile: m.mem.path, TSCkHz: m.hostTSC()}
}
