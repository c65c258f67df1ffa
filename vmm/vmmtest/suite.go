// Package vmmtest is the conformance suite every vmm.Driver passes, in the
// style of containerd's snapshotter tests: one Run call drives a driver
// through boot, pause/resume, snapshot, restore, clones and cleanup against
// real guests, reaching their agent through a tap in a test namespace.
package vmmtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/guest/agent/agentclient"
	"github.com/agentenv/agentenv/vmm"
)

// Harness is what a driver's test provides.
type Harness struct {
	Driver vmm.Driver
	// Kernel, Initrd and Rootfs boot a guest whose init is aenv-agent.
	Kernel, Initrd, Rootfs string
	// ReadyTimeout bounds boot and restore to agent-ready; default 3 minutes
	// (software emulation on a loaded machine is slow).
	ReadyTimeout time.Duration
	// UIDBase, when not zero, confines every machine the suite starts
	// (vmm.Config.RunAs) as an identity of its own from UIDBase up: a driver
	// that is a vmm.Confiner passes the suite the way a node runs it.
	UIDBase uint32
}

// Run executes the suite. Steps depend on each other (the snapshot of one
// is restored by the next), so they run in order, not in parallel.
func Run(t *testing.T, h Harness) {
	if h.ReadyTimeout == 0 {
		h.ReadyTimeout = 3 * time.Minute
	}
	s := &suite{h: h, work: t.TempDir(), top: t}
	steps := []struct {
		name string
		fn   func(*testing.T)
	}{
		{"BootToAgentReady", s.bootToReady},
		{"PauseResumeKeepsRAM", s.pauseResume},
		{"SnapshotAndStop", s.snapshotAndStop},
		{"RestoreContinues", s.restoreContinues},
		{"AdoptAfterDetach", s.adopt},
		{"TwoClonesDiverge", s.twoClones},
		{"DeviceSnapshotWithoutRAM", s.deviceSnapshot},
		{"GuestPowersOff", s.guestPowerOff},
		{"InitReapsOrphans", s.initReaps},
		{"VMMKilledAfterBoot", s.vmmKilled},
		{"StopCleansUp", s.stopCleansUp},
		{"BadInput", s.badInput},
	}
	for _, st := range steps {
		if !t.Run(st.name, st.fn) {
			t.Fatalf("step %s failed; later steps depend on it", st.name)
		}
	}
}

type suite struct {
	h       Harness
	started uint32     // machines started so far: the next identity
	top     *testing.T // owns VMs and networks that outlive one step
	work    string
	vm      vmm.Machine
	net     *TestNet
	snap    string
	// counterAtSnapshot is a guest counter value read just before the snapshot.
	counterAtSnapshot int
}

const marker = "written-before-snapshot"

func (s *suite) cmdline() string { return "root=/dev/vda ro quiet " + IPCmdline }

func (s *suite) config(id string, nic vmm.NIC) vmm.Config {
	return vmm.Config{
		ID: id, Kernel: s.h.Kernel, Initrd: s.h.Initrd, Cmdline: s.cmdline(),
		VCPUs: 1, MemoryMiB: 256, RunDir: filepath.Join(s.work, id),
		Drives: []vmm.Drive{{ID: "rootfs", Path: s.h.Rootfs, ReadOnly: true}},
		NICs:   []vmm.NIC{nic}, RunAs: s.runAs(),
	}
}

// restoreConfig is a restore of snapshot dir as machine id, confined like
// every machine of the suite.
func (s *suite) restoreConfig(id, dir string, nic vmm.NIC) vmm.RestoreConfig {
	return vmm.RestoreConfig{ID: id, SnapshotDir: dir, RunDir: filepath.Join(s.work, id), NICs: []vmm.NIC{nic}, RunAs: s.runAs()}
}

// runAs is the identity of the next machine (nil: unconfined).
func (s *suite) runAs() *vmm.Identity {
	if s.h.UIDBase == 0 {
		return nil
	}
	s.started++
	return &vmm.Identity{UID: s.h.UIDBase + s.started, GID: s.h.UIDBase + s.started}
}

// sh runs a shell command in the guest and returns its trimmed stdout.
func sh(t *testing.T, tn *TestNet, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, errOut, code, err := agentclient.Run(ctx, tn.AgentURL(), tn.HTTP, "/bin/sh", "-c", script)
	if err != nil {
		t.Fatalf("guest %q: %v", script, err)
	}
	if code != 0 {
		t.Fatalf("guest %q: exit %d: %s", script, code, errOut)
	}
	return strings.TrimSpace(string(out))
}

func (s *suite) waitReady(t *testing.T, vm vmm.Machine, tn *TestNet) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), s.h.ReadyTimeout)
	defer cancel()
	if err := tn.WaitHealthy(ctx); err != nil {
		console, _ := os.ReadFile(vm.Info().ConsoleLog)
		t.Fatalf("%v\nconsole:\n%s", err, tail(console, 3000))
	}
}

func (s *suite) bootToReady(t *testing.T) {
	s.net = NewTestNet(s.top)
	vm, err := s.h.Driver.Boot(context.Background(), s.config("boot", s.net.NIC()))
	if err != nil {
		t.Fatal(err)
	}
	s.vm = vm
	s.top.Cleanup(func() { _ = vm.Stop(context.Background()) })
	s.waitReady(t, vm, s.net)
	if got := sh(t, s.net, "cat /proc/1/comm; id -un user"); !strings.Contains(got, "user") {
		t.Fatalf("guest has no default user: %q", got)
	}
	waitConsole(t, vm, "aenv-agent: ready")
	info := vm.Info()
	if info.PID <= 0 || info.ControlSocket == "" {
		t.Fatalf("info incomplete: %+v", info)
	}
	// The VMM runs under a seccomp filter (mode 2): a guest that escapes
	// into it finds most system calls refused.
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", info.PID))
	if err != nil || !strings.Contains(string(status), "\nSeccomp:\t2\n") {
		t.Fatalf("VMM %d is not under a seccomp filter (mode 2): %v\n%s", info.PID, err, status)
	}
	// A confined VMM runs as its own identity, not root (uid != 0).
	if s.h.UIDBase != 0 && !strings.Contains(string(status), fmt.Sprintf("\nUid:\t%d\t", s.h.UIDBase+1)) {
		t.Fatalf("VMM %d does not run as its identity %d:\n%s", info.PID, s.h.UIDBase+1, status)
	}
}

func (s *suite) pauseResume(t *testing.T) {
	ctx := context.Background()
	sh(t, s.net, "echo "+marker+" > /dev/shm/marker")
	if err := s.vm.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	// While paused the agent must not answer.
	pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	if err := s.net.WaitHealthy(pctx); err == nil {
		t.Error("agent answered while the VM was paused")
	}
	cancel()
	if err := s.vm.Pause(ctx); err != nil {
		t.Fatalf("pausing a paused VM: %v", err)
	}
	if err := s.vm.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if got := sh(t, s.net, "cat /dev/shm/marker"); got != marker {
		t.Fatalf("tmpfs file after resume = %q", got)
	}
}

func (s *suite) snapshotAndStop(t *testing.T) {
	ctx := context.Background()
	// A counter that keeps running in the guest, orphaned to PID 1.
	sh(t, s.net, `nohup sh -c 'i=0; while :; do i=$((i+1)); echo $i > /dev/shm/counter; sleep 0.05; done' >/dev/null 2>&1 &`)
	waitCounter(t, s.net, 3)
	s.counterAtSnapshot = counter(t, s.net)
	if _, err := s.vm.Snapshot(ctx, filepath.Join(s.work, "snap-running")); !errors.Is(err, vmm.ErrNotPaused) {
		t.Fatalf("snapshot of a running VM: got %v, want ErrNotPaused", err)
	}
	if err := s.vm.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	s.snap = filepath.Join(s.work, "snap")
	snap, err := s.vm.Snapshot(ctx, s.snap)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("snapshot: state %d bytes, memory %d MiB, took %s", snap.StateBytes, snap.MemBytes>>20, snap.Took)
	for _, f := range []string{snap.StateFile, snap.MemoryFile, filepath.Join(s.snap, vmm.SnapshotConfigFile)} {
		if _, err := os.Stat(f); err != nil {
			t.Fatalf("snapshot file missing: %v", err)
		}
	}
	// The source may go on after a snapshot.
	if err := s.vm.Resume(ctx); err != nil {
		t.Fatalf("resume after snapshot: %v", err)
	}
	if err := s.vm.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

func (s *suite) restore(t *testing.T, id string) (vmm.Machine, *TestNet) {
	t.Helper()
	tn := NewTestNet(s.top)
	vm, err := s.h.Driver.Restore(context.Background(), s.restoreConfig(id, s.snap, tn.NIC()))
	if err != nil {
		t.Fatal(err)
	}
	s.top.Cleanup(func() { _ = vm.Stop(context.Background()) })
	s.waitReady(t, vm, tn)
	return vm, tn
}

func (s *suite) restoreContinues(t *testing.T) {
	vm, tn := s.restore(t, "restored")
	if got := sh(t, tn, "cat /dev/shm/marker"); got != marker {
		t.Fatalf("tmpfs file after restore = %q", got)
	}
	c1 := counter(t, tn)
	if c1 < s.counterAtSnapshot {
		t.Fatalf("restored counter %d is behind the value %d read before the snapshot", c1, s.counterAtSnapshot)
	}
	waitCounter(t, tn, c1+3)
	s.vm = vm
	s.net = tn
}

// adopt drops the handle of the running restored VM, as a restarting node
// process would, and takes the VM over again from its run directory.
func (s *suite) adopt(t *testing.T) {
	ad, ok := s.h.Driver.(vmm.Adopter)
	det, ok2 := s.vm.(vmm.Detacher)
	if !ok || !ok2 {
		t.Skipf("driver %s does not support adoption", s.h.Driver.Name())
	}
	info := s.vm.Info()
	if err := det.Detach(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	vm, err := ad.Adopt(ctx, info.RunDir)
	if err != nil {
		t.Fatal(err)
	}
	s.top.Cleanup(func() { _ = vm.Stop(context.Background()) })
	if got := vm.Info(); got.PID != info.PID || got.MemoryFile != info.MemoryFile {
		t.Fatalf("adopted %+v, was %+v", got, info)
	}
	if err := vm.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := vm.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if got := sh(t, s.net, "cat /dev/shm/marker"); got != marker {
		t.Fatalf("adopted VM lost its tmpfs file: %q", got)
	}
	s.vm = vm
	if _, err := ad.Adopt(ctx, filepath.Join(s.work, "no-such-run-dir")); err == nil {
		t.Fatal("adopting a missing run directory succeeded")
	}
}

func (s *suite) twoClones(t *testing.T) {
	type clone struct {
		vm vmm.Machine
		tn *TestNet
	}
	var clones []clone
	for i := range 2 {
		vm, tn := s.restore(t, fmt.Sprintf("clone%d", i))
		clones = append(clones, clone{vm, tn})
	}
	if a, b := clones[0].vm.Info(), clones[1].vm.Info(); a.MemoryFile != b.MemoryFile || a.PID == b.PID {
		t.Fatalf("clones must share one memory image in two processes: %+v / %+v", a, b)
	}
	for i, c := range clones {
		sh(t, c.tn, fmt.Sprintf("echo clone-%d > /dev/shm/who", i))
	}
	for i, c := range clones {
		if got := sh(t, c.tn, "cat /dev/shm/who /dev/shm/marker"); got != fmt.Sprintf("clone-%d\n%s", i, marker) {
			t.Fatalf("clone %d sees %q", i, got)
		}
	}
	if got := sh(t, s.net, "cat /dev/shm/who 2>/dev/null || echo none"); got != "none" {
		t.Fatalf("the first restore sees a clone's write: %q", got)
	}
}

// maxDeviceState bounds the state of a 256 MiB guest snapshotted without
// RAM: device state is tens of KiB, the guest's RAM over a hundred MiB.
const maxDeviceState = 8 << 20

// deviceSnapshot (drivers implementing vmm.DeviceSnapshotter): the running
// VM, restored from a memory image it maps privately, snapshots without RAM;
// its RAM, captured from the VMM process, restores with that state.
func (s *suite) deviceSnapshot(t *testing.T) {
	ds, ok := s.vm.(vmm.DeviceSnapshotter)
	if !ok {
		t.Skipf("driver %s cannot snapshot without RAM", s.h.Driver.Name())
	}
	ctx := context.Background()
	sh(t, s.net, "echo devsnap > /dev/shm/devsnap")
	before := counter(t, s.net)
	if err := s.vm.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(s.work, "devsnap")
	snap, err := ds.SnapshotDevices(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("device snapshot: state %d bytes for %d MiB of RAM, took %s", snap.StateBytes, snap.MemBytes>>20, snap.Took)
	if snap.StateBytes <= 0 || snap.StateBytes >= maxDeviceState || snap.MemBytes != 256<<20 || snap.MemoryFile != "" {
		t.Fatalf("device snapshot %+v: want 0 < state < %d bytes, 256 MiB of RAM, no memory file", snap, maxDeviceState)
	}
	mem := filepath.Join(s.work, "devsnap-memory")
	if _, err := CaptureMemory(s.vm.Info().PID, s.vm.Info().MemoryFile, mem); err != nil {
		t.Fatal(err)
	}
	if err := s.vm.Resume(ctx); err != nil {
		t.Fatalf("resume after a device snapshot: %v", err)
	}
	tn := NewTestNet(s.top)
	rc := s.restoreConfig("devsnap-run", dir, tn.NIC())
	rc.ID, rc.MemoryFile = "devsnap", mem
	vm, err := s.h.Driver.Restore(ctx, rc)
	if err != nil {
		t.Fatal(err)
	}
	s.top.Cleanup(func() { _ = vm.Stop(context.Background()) })
	s.waitReady(t, vm, tn)
	if got := sh(t, tn, "cat /dev/shm/marker /dev/shm/devsnap"); got != marker+"\ndevsnap" {
		t.Fatalf("tmpfs files after restoring a device snapshot = %q", got)
	}
	after := counter(t, tn)
	if after < before {
		t.Fatalf("counter %d after restore is behind %d before the snapshot", after, before)
	}
	waitCounter(t, tn, after+3)
	if err := vm.Stop(ctx); err != nil {
		t.Fatal(err)
	}
}

// guestPowerOff asks the guest's init to shut down; the VMM must exit by itself.
func (s *suite) guestPowerOff(t *testing.T) {
	vm, tn := s.restore(t, "poweroff")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The agent may die with the rest of userspace before it answers.
	_, _, _, _ = agentclient.RunWith(ctx, tn.AgentURL(), tn.HTTP, []agentclient.Option{agentclient.WithUser("root")}, "/bin/sh", "-c", "sync; kill -TERM 1")
	if err := vm.Wait(ctx); err != nil && ctx.Err() != nil {
		console, _ := os.ReadFile(vm.Info().ConsoleLog)
		t.Fatalf("VM still running a minute after its init was asked to power off\nconsole:\n%s", tail(console, 2000))
	}
	waitConsole(t, vm, "power off")
	if err := vm.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// initReaps: a process orphaned in the guest (its parent exited) is
// reparented to init, which must reap it when it exits: no zombies pile up.
func (s *suite) initReaps(t *testing.T) {
	vm, tn := s.restore(t, "reap")
	defer vm.Stop(context.Background())
	sh(t, tn, "for i in 1 2 3 4 5; do (sleep 0.2 &); done")
	deadline := time.Now().Add(20 * time.Second)
	for {
		z := sh(t, tn, `sleep 0.5; grep -l '^State:.*Z' /proc/[0-9]*/status 2>/dev/null || true`)
		if z == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("zombies in the guest 20 s after their parent exited: %s", z)
		}
	}
}

// vmmKilled: a VMM that dies after boot (killed, crashed) is reported by
// Wait, and Stop still removes its sockets and run directory.
func (s *suite) vmmKilled(t *testing.T) {
	vm, _ := s.restore(t, "killed")
	info := vm.Info()
	if err := syscall.Kill(info.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill VMM %d: %v", info.PID, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := vm.Wait(ctx)
	if ctx.Err() != nil {
		t.Fatal("Wait did not return within 30 s of the VMM being killed")
	}
	if err == nil {
		t.Error("Wait reported a killed VMM as a clean exit")
	}
	if err := vm.Stop(context.Background()); err != nil {
		t.Fatalf("stop after the VMM died: %v", err)
	}
	if alive(info.PID) {
		t.Errorf("process %d still running", info.PID)
	}
	for _, p := range []string{info.ControlSocket, info.RunDir} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind after the VMM died and Stop", p)
		}
	}
}

// waitConsole waits until the guest console log contains want.
func waitConsole(t *testing.T, vm vmm.Machine, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := os.ReadFile(vm.Info().ConsoleLog)
		if strings.Contains(string(b), want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("console never showed %q:\n%s", want, tail(b, 2000))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *suite) stopCleansUp(t *testing.T) {
	ctx := context.Background()
	info := s.vm.Info()
	if err := s.vm.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.vm.Stop(ctx); err != nil {
		t.Fatalf("second stop: %v", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = s.vm.Wait(wctx)
	if alive(info.PID) {
		t.Errorf("process %d still running after Stop", info.PID)
	}
	for _, p := range []string{info.ControlSocket, info.RunDir} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind after Stop", p)
		}
	}
	if err := s.vm.Pause(ctx); !errors.Is(err, vmm.ErrStopped) {
		t.Errorf("pause after stop: got %v, want ErrStopped", err)
	}
}

func (s *suite) badInput(t *testing.T) {
	ctx := context.Background()
	tn := NewTestNet(t)
	garbage := filepath.Join(s.work, "garbage-kernel")
	if err := os.WriteFile(garbage, []byte(strings.Repeat("not a kernel ", 4096)), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		mutate func(*vmm.Config)
		want   string
	}{
		{"MissingKernel", func(c *vmm.Config) { c.Kernel = filepath.Join(s.work, "no-such-kernel") }, "kernel"},
		{"BadDrivePath", func(c *vmm.Config) { c.Drives[0].Path = filepath.Join(s.work, "no-such-disk") }, "drive rootfs"},
		{"VMMDiesMidBoot", func(c *vmm.Config) { c.Kernel = garbage }, "exited"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := s.config("bad-"+strings.ToLower(tc.name), tn.NIC())
			tc.mutate(&cfg)
			before := children()
			vm, err := s.h.Driver.Boot(ctx, cfg)
			defer func() {
				for pid, cmd := range children() {
					if _, ok := before[pid]; !ok {
						t.Errorf("failed boot left process %d (%s) running", pid, cmd)
					}
				}
			}()
			if err == nil {
				_ = vm.Stop(ctx)
				t.Fatal("boot succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not name %q", err, tc.want)
			}
			if _, statErr := os.Stat(cfg.RunDir); !errors.Is(statErr, os.ErrNotExist) {
				t.Fatalf("run dir %s left behind", cfg.RunDir)
			}
		})
	}
	t.Run("RestoreMissingSnapshot", func(t *testing.T) {
		_, err := s.h.Driver.Restore(ctx, vmm.RestoreConfig{ID: "nosnap", SnapshotDir: filepath.Join(s.work, "nope"), RunDir: filepath.Join(s.work, "nosnap"), NICs: []vmm.NIC{tn.NIC()}})
		if err == nil || !strings.Contains(err.Error(), "nope") {
			t.Fatalf("restore of a missing snapshot: %v", err)
		}
	})
}

func counter(t *testing.T, tn *TestNet) int {
	t.Helper()
	// The guest loop rewrites the file in place: a read can fall between
	// truncate and write, so an empty value is read again.
	for try := 0; ; try++ {
		out := sh(t, tn, "cat /dev/shm/counter")
		n, err := strconv.Atoi(out)
		if err == nil {
			return n
		}
		if out != "" || try == 20 {
			t.Fatalf("counter: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitCounter waits until the guest counter reaches at least n.
func waitCounter(t *testing.T, tn *TestNet, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		out := sh(t, tn, "cat /dev/shm/counter 2>/dev/null || echo 0")
		if v, _ := strconv.Atoi(out); v >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("guest counter stuck at %s, want >= %d", out, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// children returns the live child processes of this test process by pid,
// with their command names.
func children() map[int]string {
	out := map[int]string{}
	ents, _ := os.ReadDir("/proc")
	self := os.Getpid()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		st := string(b)
		open, closeP := strings.IndexByte(st, '('), strings.LastIndexByte(st, ')')
		if open < 0 || closeP < open {
			continue
		}
		f := strings.Fields(st[closeP+1:]) // state, ppid, ...
		if len(f) >= 2 && f[1] == strconv.Itoa(self) && f[0] != "Z" && f[0] != "X" {
			out[pid] = st[open+1 : closeP]
		}
	}
	return out
}

// alive reports whether pid is a live process. A zombie counts as gone: an
// adopted VMM is not our child, so its original parent (in this test, the
// handle that detached it) reaps it a moment after it exits.
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name, which may hold spaces.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || (s[i+2] != 'Z' && s[i+2] != 'X')
}
