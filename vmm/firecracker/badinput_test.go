package firecracker

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/vmm"
)

// shellFirecracker is a "firecracker" that complains and exits at once.
func shellFirecracker(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "firecracker")
	script := "#!/bin/sh\necho 'Error: RunWithApiError(FailedToBindSocket)' >&2\nexit 3\n"
	writeExecutable(t, p, script)
	return p
}

func TestBootBadInput(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		mode      string // fake firecracker mode; "shell" for the exiting script
		preRunDir bool   // the run dir exists before Boot (with a file of someone else)
		timeout   time.Duration
		mutate    func(env testEnv, c *vmm.Config)
		want      []string // substrings of the error
		wantIs    error
		started   bool // a fake process was started (and must be gone)
	}{
		{name: "missing kernel", mutate: func(env testEnv, c *vmm.Config) { c.Kernel = filepath.Join(env.dir, "no-vmlinux") },
			want: []string{"boot k1", "kernel", "no-vmlinux", "no such file"}},
		{name: "missing drive", mutate: func(env testEnv, c *vmm.Config) { c.Drives[1].Path = filepath.Join(env.dir, "gone.img") },
			want: []string{"drive data", "gone.img", "no such file"}},
		{name: "drive is a directory", started: true, mutate: func(env testEnv, c *vmm.Config) { c.Drives[0].Path = env.dir },
			want: []string{"PUT /drives/rootfs", "Is a directory"}},
		{name: "drive is a directory, run dir existed", started: true, preRunDir: true,
			mutate: func(env testEnv, c *vmm.Config) { c.Drives[0].Path = env.dir },
			want:   []string{"PUT /drives/rootfs", "Is a directory"}},
		{name: "nbd drive", mutate: func(env testEnv, c *vmm.Config) {
			sock := touchFile(t, filepath.Join(env.dir, "nbd.sock"), 0)
			c.Drives[0] = vmm.Drive{ID: "rootfs", NBD: &vmm.NBDSource{Socket: sock}}
		}, want: []string{"drive rootfs", "NBD", "/dev/nbd"}, wantIs: vmm.ErrUnsupported},
		{name: "tap by fd only", mutate: func(env testEnv, c *vmm.Config) {
			c.NICs[0].TapName = ""
			c.NICs[0].Tap = os.Stdin
		}, want: []string{"nic eth0", "TapName"}, wantIs: vmm.ErrUnsupported},
		{name: "too many vcpus", mutate: func(_ testEnv, c *vmm.Config) { c.VCPUs = 48 },
			want: []string{"vcpus 48", "at most 32"}},
		{name: "vmm exits at once", mode: "shell",
			want: []string{"firecracker exited", "exit status 3", "FailedToBindSocket"}},
		{name: "vmm dies mid-boot", mode: "die-on-start", started: true,
			want: []string{"firecracker exited", "exit status 4", "KVM_CREATE_VM"}},
		{name: "vmm never opens its socket", mode: "no-socket", started: true, timeout: 300 * time.Millisecond,
			want: []string{"API socket", "not ready after 300ms"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := newTestEnv(t)
			var d *Driver
			var log string
			if tc.mode == "shell" {
				var err error
				if d, err = New(Options{Binary: shellFirecracker(t)}); err != nil {
					t.Fatal(err)
				}
			} else {
				d, log = newFakeDriver(t, tc.mode, func(o *Options) {
					if tc.timeout != 0 {
						o.StartTimeout = tc.timeout
					}
				})
			}
			foreign := filepath.Join(env.runDir, "keep-me")
			if tc.preRunDir {
				if err := os.MkdirAll(env.runDir, 0o755); err != nil {
					t.Fatal(err)
				}
				touchFile(t, foreign, 1)
			}
			cfg := env.config("k1")
			if tc.mutate != nil {
				tc.mutate(env, &cfg)
			}
			vm, err := d.Boot(context.Background(), cfg)
			if err == nil {
				vm.Stop(context.Background())
				t.Fatal("Boot succeeded")
			}
			t.Logf("error: %v", err)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Errorf("error %v is not %v", err, tc.wantIs)
			}
			if tc.started {
				if pid := fakePID(t, log); !processGone(pid) {
					t.Errorf("firecracker pid %d still runs", pid)
				}
			}
			assertNoLeftovers(t, env.runDir, tc.preRunDir, foreign)
		})
	}
}

// assertNoLeftovers checks that a failed start left nothing in runDir but
// files that were there before.
func assertNoLeftovers(t *testing.T, runDir string, existed bool, keep ...string) {
	t.Helper()
	entries, err := os.ReadDir(runDir)
	if !existed {
		if !os.IsNotExist(err) {
			t.Errorf("run dir %s left behind (%v, %d entries)", runDir, err, len(entries))
		}
		return
	}
	if err != nil {
		t.Fatalf("run dir %s that existed before is gone: %v", runDir, err)
	}
	for _, e := range entries {
		if p := filepath.Join(runDir, e.Name()); !slices.Contains(keep, p) {
			t.Errorf("left behind: %s", p)
		}
	}
	for _, k := range keep {
		if _, err := os.Stat(k); err != nil {
			t.Errorf("removed a file it did not create: %v", err)
		}
	}
}

func TestBootCancelled(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	d, log := newFakeDriver(t, "no-socket", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := d.Boot(ctx, env.config("c1"))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Boot with an expiring context: %v, want DeadlineExceeded", err)
	}
	if pid := fakePID(t, log); !processGone(pid) {
		t.Errorf("firecracker pid %d still runs", pid)
	}
	assertNoLeftovers(t, env.runDir, false)
}

func TestNewBadOptions(t *testing.T) {
	t.Parallel()
	exe, _ := fakeExecutable(t, "firecracker", "firecracker", "")
	tests := []struct {
		name string
		opts Options
		want string
	}{
		{"no binary", Options{Binary: filepath.Join(t.TempDir(), "firecracker")}, "firecracker binary"},
		{"bad log level", Options{Binary: exe, LogLevel: "Loud"}, "log level"},
		{"mmds without interfaces", Options{Binary: exe, MMDS: &MMDSOptions{}}, "MMDS"},
		{"mmds bad version", Options{Binary: exe, MMDS: &MMDSOptions{Version: "V3", Interfaces: []string{"eth0"}}}, "V3"},
		{"relative chroot", Options{Binary: exe, Jailer: &JailerOptions{Binary: exe, ChrootBase: "jail"}}, "absolute"},
		{"no jailer", Options{Binary: exe, Jailer: &JailerOptions{Binary: filepath.Join(t.TempDir(), "jailer")}}, "jailer binary"},
	}
	for _, tc := range tests {
		if _, err := New(tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New = %v, want an error about %q", tc.name, err, tc.want)
		}
	}
}

func TestRestoreBadInput(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	d, _ := newFakeDriver(t, "", nil)
	snapDir := bootAndSnapshot(t, d, env, "orig", false)
	// A snapshot whose drive has since disappeared.
	env2 := newTestEnv(t)
	goneDir := bootAndSnapshot(t, d, env2, "orig2", false)
	if err := os.Remove(env2.rootfs); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		cfg    vmm.RestoreConfig
		want   []string
		wantIs error
	}{
		{"no snapshot", vmm.RestoreConfig{SnapshotDir: filepath.Join(env.dir, "nothing")}, []string{"config.json", "no such file"}, nil},
		{"unknown drive", vmm.RestoreConfig{SnapshotDir: snapDir, Drives: []vmm.Drive{{ID: "extra", Path: env.data}}}, []string{"drive extra is not in the snapshot"}, nil},
		{"unknown nic", vmm.RestoreConfig{SnapshotDir: snapDir, NICs: []vmm.NIC{{ID: "eth1", MAC: "02:00:00:00:00:09", TapName: "tap1"}}}, []string{"nic eth1 is not in the snapshot"}, nil},
		{"other mac", vmm.RestoreConfig{SnapshotDir: snapDir, NICs: []vmm.NIC{{ID: "eth0", MAC: "02:00:00:00:00:09", TapName: "tap1"}}}, []string{"MAC", "differs"}, nil},
		{"nbd drive", vmm.RestoreConfig{SnapshotDir: snapDir, Drives: []vmm.Drive{{ID: "rootfs", NBD: &vmm.NBDSource{Socket: env.data}}}}, []string{"NBD"}, vmm.ErrUnsupported},
		{"read-only flip", vmm.RestoreConfig{SnapshotDir: snapDir, Drives: []vmm.Drive{{ID: "data", Path: env.data}}}, []string{"read-only"}, nil},
		{"missing memory override", vmm.RestoreConfig{SnapshotDir: snapDir, MemoryFile: filepath.Join(env.dir, "nomem")}, []string{"memory file", "nomem"}, nil},
		{"snapshot-time drive gone", vmm.RestoreConfig{SnapshotDir: goneDir, Drives: []vmm.Drive{{ID: "rootfs", Path: env.rootfs}}}, []string{"drive rootfs", "reopens the snapshot-time path", "no such file"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := tc.cfg
			cfg.ID = "bad"
			cfg.RunDir = filepath.Join(t.TempDir(), "run")
			vm, err := d.Restore(context.Background(), cfg)
			if err == nil {
				vm.Stop(context.Background())
				t.Fatal("Restore succeeded")
			}
			t.Logf("error: %v", err)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Errorf("error %v is not %v", err, tc.wantIs)
			}
			assertNoLeftovers(t, cfg.RunDir, false)
		})
	}
}

// TestRestoreLoadFails covers a load Firecracker refuses after the process
// started: the process and the run dir must go.
func TestRestoreLoadFails(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	d, _ := newFakeDriver(t, "", nil)
	snapDir := bootAndSnapshot(t, d, env, "lf", false)
	// A memory image of the wrong size: the fake, like Firecracker, refuses it.
	small := touchFile(t, filepath.Join(env.dir, "small-memory"), 4096)
	d2, log := newFakeDriver(t, "", nil)
	runDir := filepath.Join(t.TempDir(), "run")
	_, err := d2.Restore(context.Background(), vmm.RestoreConfig{ID: "lf2", SnapshotDir: snapDir, MemoryFile: small, RunDir: runDir})
	if err == nil || !strings.Contains(err.Error(), "PUT /snapshot/load") || !strings.Contains(err.Error(), "memory file is 4096 bytes") {
		t.Fatalf("restore with a short memory file: %v", err)
	}
	if pid := fakePID(t, log); !processGone(pid) {
		t.Errorf("firecracker pid %d still runs", pid)
	}
	assertNoLeftovers(t, runDir, false)
}

func TestWaitReportsCrash(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	d, _ := newFakeDriver(t, "", nil)
	vm, err := d.Boot(context.Background(), env.config("crash"))
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Stop(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := vm.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait on a running machine: %v, want DeadlineExceeded", err)
	}
	// Something other than Stop kills the VMM: Wait says so, calls fail with ErrStopped.
	p, _ := os.FindProcess(vm.Info().PID)
	_ = p.Kill()
	err = vm.Wait(context.Background())
	if err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("Wait after the VMM was killed: %v", err)
	}
	if err := vm.Pause(context.Background()); !errors.Is(err, vmm.ErrStopped) {
		t.Errorf("pause of a dead machine: %v, want ErrStopped", err)
	}
	if err := vm.Stop(context.Background()); err != nil {
		t.Errorf("stop of a dead machine: %v", err)
	}
	assertNoLeftovers(t, env.runDir, false)
}
