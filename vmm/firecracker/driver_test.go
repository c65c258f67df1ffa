package firecracker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/internal/testenv"
	"github.com/agentenv/agentenv/vmm"
)

// testEnv is a kernel, two drives and a run directory in a temp dir.
type testEnv struct {
	dir, kernel, rootfs, data, runDir string
}

func newTestEnv(t *testing.T) testEnv {
	t.Helper()
	dir := t.TempDir()
	return testEnv{
		dir:    dir,
		kernel: touchFile(t, filepath.Join(dir, "vmlinux"), 64),
		rootfs: touchFile(t, filepath.Join(dir, "rootfs.ext4"), 4096),
		data:   touchFile(t, filepath.Join(dir, "data.img"), 4096),
		runDir: filepath.Join(dir, "run"),
	}
}

func (e testEnv) config(id string) vmm.Config {
	return vmm.Config{
		ID: id, Kernel: e.kernel, Cmdline: "root=/dev/vda rw", MemoryMiB: 32, VCPUs: 2,
		Drives: []vmm.Drive{{ID: "rootfs", Path: e.rootfs}, {ID: "data", Path: e.data, ReadOnly: true}},
		NICs:   []vmm.NIC{{ID: "eth0", MAC: "02:aa:bb:cc:dd:01", TapName: "tap0"}},
		RunDir: e.runDir,
	}
}

func newFakeDriver(t *testing.T, mode string, mutate func(*Options)) (*Driver, string) {
	t.Helper()
	exe, log := fakeExecutable(t, "firecracker", "firecracker", mode)
	o := Options{Binary: exe, StartTimeout: 3 * time.Second, Log: slog.New(slog.DiscardHandler)}
	if mutate != nil {
		mutate(&o)
	}
	d, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return d, log
}

// apiCalls drops the EXEC records, leaving API requests.
func apiCalls(calls []call) []call {
	var out []call
	for _, c := range calls {
		if c.Method != "EXEC" {
			out = append(out, c)
		}
	}
	return out
}

func findCall(calls []call, method, path string) (call, bool) {
	for _, c := range calls {
		if c.Method == method && c.Path == path {
			return c, true
		}
	}
	return call{}, false
}

func noFaults(t *testing.T, calls []call) {
	t.Helper()
	for _, c := range calls {
		if c.Status >= 300 {
			t.Errorf("%s %s answered %d: %s", c.Method, c.Path, c.Status, c.Fault)
		}
	}
}

func TestBootPauseSnapshotStop(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	d, log := newFakeDriver(t, "", func(o *Options) {
		o.Metrics = true
		o.Balloon = &BalloonOptions{AmountMiB: 0, DeflateOnOOM: true, StatsPollingIntervalS: 1}
		o.MMDS = &MMDSOptions{Interfaces: []string{"eth0"}}
	})
	ctx := context.Background()
	vm, err := d.Boot(ctx, env.config("vm1"))
	if err != nil {
		t.Fatal(err)
	}
	m := vm.(*Machine)
	info := vm.Info()
	if info.Driver != Name || info.PID <= 0 || info.Accel != "kvm" || info.RunDir != env.runDir {
		t.Errorf("info = %+v", info)
	}
	if _, err := os.Stat(info.ControlSocket); err != nil {
		t.Errorf("control socket: %v", err)
	}
	if state, err := m.State(ctx); err != nil || state != "Running" {
		t.Errorf("state = %q, %v; want Running", state, err)
	}

	calls := apiCalls(readCalls(t, log))
	noFaults(t, calls)
	order := []string{"PUT /logger", "PUT /metrics", "PUT /machine-config", "PUT /boot-source", "PUT /drives/rootfs",
		"PUT /drives/data", "PUT /network-interfaces/eth0", "PUT /balloon", "PUT /mmds/config", "PUT /actions"}
	for i, want := range order {
		if got := calls[i].Method + " " + calls[i].Path; got != want {
			t.Fatalf("call %d = %s, want %s (all: %v)", i, got, want, calls)
		}
	}
	boot, _ := findCall(calls, "PUT", "/boot-source")
	if args := boot.Body["boot_args"].(string); !strings.HasPrefix(args, "root=/dev/vda rw ") || !strings.Contains(args, "console=ttyS0") {
		t.Errorf("boot_args = %q", args)
	}
	data, _ := findCall(calls, "PUT", "/drives/data")
	if data.Body["is_read_only"] != true || data.Body["path_on_host"] != env.data {
		t.Errorf("data drive body = %v", data.Body)
	}
	nic, _ := findCall(calls, "PUT", "/network-interfaces/eth0")
	if nic.Body["guest_mac"] != "02:aa:bb:cc:dd:01" || nic.Body["host_dev_name"] != "tap0" {
		t.Errorf("nic body = %v", nic.Body)
	}
	mc, _ := findCall(calls, "PUT", "/machine-config")
	if !jsonEqual(mc.Body["vcpu_count"], 2) || !jsonEqual(mc.Body["mem_size_mib"], 32) {
		t.Errorf("machine config = %v", mc.Body)
	}

	// The guest's serial output lands in the console log.
	waitFor(t, func() bool {
		b, _ := os.ReadFile(info.ConsoleLog)
		return strings.Contains(string(b), "fake guest: Linux")
	}, "console log to show the guest")

	// Metadata and balloon.
	if err := m.PutMetadata(ctx, map[string]any{"sandbox": "vm1"}); err != nil {
		t.Fatal(err)
	}
	if md, err := m.Metadata(ctx); err != nil || !jsonEqual(md, map[string]any{"sandbox": "vm1"}) {
		t.Errorf("metadata = %v, %v", md, err)
	}
	if err := m.SetBalloon(ctx, 8); err != nil {
		t.Fatal(err)
	}
	if st, err := m.BalloonStats(ctx); err != nil || *st.TargetMib != 8 {
		t.Errorf("balloon stats = %v, %v", st, err)
	}

	// A snapshot needs a paused machine.
	snapDir := filepath.Join(env.dir, "snap")
	if _, err := vm.Snapshot(ctx, snapDir); !errors.Is(err, vmm.ErrNotPaused) {
		t.Fatalf("snapshot of a running machine: %v, want ErrNotPaused", err)
	}
	if err := vm.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	if err := vm.Pause(ctx); err != nil {
		t.Fatalf("second pause: %v", err)
	}
	snap, err := vm.Snapshot(ctx, snapDir)
	if err != nil {
		t.Fatal(err)
	}
	if snap.StateFile != filepath.Join(snapDir, vmm.SnapshotStateFile) || snap.MemoryFile != filepath.Join(snapDir, vmm.SnapshotMemoryFile) {
		t.Errorf("snapshot files = %+v", snap)
	}
	if snap.MemBytes != 32<<20 || snap.StateBytes == 0 {
		t.Errorf("snapshot sizes: state %d, memory %d (want 32 MiB)", snap.StateBytes, snap.MemBytes)
	}
	meta, err := readConfig(snapDir)
	if err != nil {
		t.Fatal(err)
	}
	if meta.Type != "Full" || meta.VCPUs != 2 || meta.MemoryMiB != 32 || len(meta.Drives) != 2 || meta.NICs[0].TapName != "tap0" || meta.NICs[0].MAC != "02:aa:bb:cc:dd:01" {
		t.Errorf("config.json = %+v", meta)
	}
	if _, err := m.SnapshotDiff(ctx, filepath.Join(env.dir, "diff")); !errors.Is(err, vmm.ErrUnsupported) {
		t.Errorf("diff snapshot without dirty tracking: %v, want ErrUnsupported", err)
	}
	if err := vm.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	calls = apiCalls(readCalls(t, log))
	pauses := 0
	for _, c := range calls {
		if c.Method == "PATCH" && c.Path == "/vm" && c.Body["state"] == "Paused" {
			pauses++
		}
	}
	if pauses != 1 {
		t.Errorf("PATCH /vm Paused sent %d times, want 1 (pausing a paused machine is a no-op)", pauses)
	}

	pid := info.PID
	if err := vm.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if err := vm.Stop(ctx); err != nil {
		t.Errorf("second stop: %v", err)
	}
	if err := vm.Wait(ctx); err != nil {
		t.Errorf("wait after stop: %v", err)
	}
	if !processGone(pid) {
		t.Errorf("firecracker pid %d still runs after Stop", pid)
	}
	if _, err := os.Stat(env.runDir); !os.IsNotExist(err) {
		t.Errorf("run dir left behind: %v", err)
	}
	if err := vm.Pause(ctx); !errors.Is(err, vmm.ErrStopped) {
		t.Errorf("pause after stop: %v, want ErrStopped", err)
	}
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// bootAndSnapshot boots a machine, snapshots it paused and stops it.
func bootAndSnapshot(t *testing.T, d *Driver, env testEnv, id string, diff bool) string {
	t.Helper()
	ctx := context.Background()
	cfg := env.config(id)
	cfg.RunDir = filepath.Join(env.dir, "run-"+id)
	vm, err := d.Boot(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Stop(ctx)
	if err := vm.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(env.dir, "snap-"+id)
	if diff {
		_, err = vm.(DiffSnapshotter).SnapshotDiff(ctx, dir)
	} else {
		_, err = vm.Snapshot(ctx, dir)
	}
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestRestore(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	d, _ := newFakeDriver(t, "", nil)
	snapDir := bootAndSnapshot(t, d, env, "src", false)
	shared := filepath.Join(env.dir, "shared-memory")
	if err := copyFile(filepath.Join(snapDir, vmm.SnapshotMemoryFile), shared); err != nil {
		t.Fatal(err)
	}
	upper := touchFile(t, filepath.Join(env.dir, "upper.ext4"), 4096)

	tests := []struct {
		name       string
		cfg        vmm.RestoreConfig
		wantMemory string
		wantResume bool
		wantPatch  string // drive path expected in PATCH /drives/rootfs
		wantTap    string // tap expected in network_overrides
	}{
		{"as is", vmm.RestoreConfig{}, filepath.Join(snapDir, vmm.SnapshotMemoryFile), true, "", ""},
		{"paused", vmm.RestoreConfig{Paused: true}, filepath.Join(snapDir, vmm.SnapshotMemoryFile), false, "", ""},
		{"shared memory, new upper and tap", vmm.RestoreConfig{
			MemoryFile: shared,
			Drives:     []vmm.Drive{{ID: "rootfs", Path: upper}},
			NICs:       []vmm.NIC{{ID: "eth0", MAC: "02:aa:bb:cc:dd:01", TapName: "tap7"}},
		}, shared, true, upper, "tap7"},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d, log := newFakeDriver(t, "", nil)
			cfg := tc.cfg
			cfg.ID = "clone" + string(rune('a'+i))
			cfg.SnapshotDir = snapDir
			cfg.RunDir = filepath.Join(t.TempDir(), "run")
			ctx := context.Background()
			vm, err := d.Restore(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer vm.Stop(ctx)
			if got := vm.Info().MemoryFile; got != tc.wantMemory {
				t.Errorf("Info().MemoryFile = %q, want %q", got, tc.wantMemory)
			}
			calls := apiCalls(readCalls(t, log))
			noFaults(t, calls)
			load, ok := findCall(calls, "PUT", "/snapshot/load")
			if !ok {
				t.Fatal("no snapshot load")
			}
			if !jsonEqual(load.Body["mem_backend"], map[string]any{"backend_type": "File", "backend_path": tc.wantMemory}) {
				t.Errorf("mem_backend = %v", load.Body["mem_backend"])
			}
			resumed := load.Body["resume_vm"] == true
			if _, patched := findCall(calls, "PATCH", "/vm"); patched {
				resumed = true
			}
			if resumed != tc.wantResume {
				t.Errorf("resumed = %v, want %v (calls %v)", resumed, tc.wantResume, calls)
			}
			patch, patched := findCall(calls, "PATCH", "/drives/rootfs")
			if tc.wantPatch == "" && patched || tc.wantPatch != "" && patch.Body["path_on_host"] != tc.wantPatch {
				t.Errorf("drive patch = %v (present %v), want path %q", patch.Body, patched, tc.wantPatch)
			}
			if tc.wantTap != "" {
				want := []any{map[string]any{"iface_id": "eth0", "host_dev_name": tc.wantTap}}
				if !jsonEqual(load.Body["network_overrides"], want) {
					t.Errorf("network_overrides = %v", load.Body["network_overrides"])
				}
			} else if _, ok := load.Body["network_overrides"]; ok {
				t.Errorf("network_overrides sent without a tap change")
			}
			// A clone can be snapshotted again; its config.json names what it now uses.
			if err := vm.Pause(ctx); err != nil {
				t.Fatal(err)
			}
			again := filepath.Join(t.TempDir(), "again")
			if _, err := vm.Snapshot(ctx, again); err != nil {
				t.Fatal(err)
			}
			meta, err := readConfig(again)
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantPatch != "" && meta.Drives[0].Path != tc.wantPatch {
				t.Errorf("re-snapshot drive = %+v, want %s", meta.Drives[0], tc.wantPatch)
			}
			if tc.wantTap != "" && meta.NICs[0].TapName != tc.wantTap {
				t.Errorf("re-snapshot tap = %q, want %s", meta.NICs[0].TapName, tc.wantTap)
			}
		})
	}
}

func TestDiffSnapshot(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	d, log := newFakeDriver(t, "", func(o *Options) { o.TrackDirtyPages = true })
	dir := bootAndSnapshot(t, d, env, "diffy", true)
	meta, err := readConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	if meta.Type != "Diff" || !meta.TrackDirtyPages {
		t.Errorf("config.json = %+v, want a Diff snapshot with dirty tracking", meta)
	}
	calls := apiCalls(readCalls(t, log))
	mc, _ := findCall(calls, "PUT", "/machine-config")
	create, _ := findCall(calls, "PUT", "/snapshot/create")
	if mc.Body["track_dirty_pages"] != true || create.Body["snapshot_type"] != "Diff" {
		t.Errorf("machine-config %v, snapshot %v", mc.Body, create.Body)
	}
	// A restored machine keeps tracking, so it can write diffs too.
	d2, log2 := newFakeDriver(t, "", func(o *Options) { o.TrackDirtyPages = true })
	rc := vmm.RestoreConfig{ID: "diffy2", SnapshotDir: dir, RunDir: filepath.Join(t.TempDir(), "r")}
	if _, err := d2.Restore(context.Background(), rc); err == nil || !strings.Contains(err.Error(), "merge it onto the parent") {
		t.Fatalf("restoring a diff without a merged memory image: %v", err)
	}
	// The fake's diff memory file is full-sized; it stands in for a merged image.
	rc.MemoryFile = filepath.Join(dir, vmm.SnapshotMemoryFile)
	vm, err := d2.Restore(context.Background(), rc)
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Stop(context.Background())
	load, _ := findCall(apiCalls(readCalls(t, log2)), "PUT", "/snapshot/load")
	if load.Body["enable_diff_snapshots"] != true {
		t.Errorf("load body %v: want enable_diff_snapshots", load.Body)
	}
}

func TestBootArgs(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"", "console=ttyS0 reboot=k panic=1 pci=off"},
		{"root=/dev/vda rw", "root=/dev/vda rw console=ttyS0 reboot=k panic=1 pci=off"},
		{"console=hvc0 panic=-1", "console=hvc0 panic=-1 reboot=k pci=off"},
		{"quiet -- --agent-port 49983", "quiet console=ttyS0 reboot=k panic=1 pci=off -- --agent-port 49983"},
	}
	for _, tc := range tests {
		if got := bootArgs(tc.in); got != tc.want {
			t.Errorf("bootArgs(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestReadConfigRejects(t *testing.T) {
	t.Parallel()
	good := snapshotConfig{Driver: Name, Format: configFormat, Type: "Full", VCPUs: 1, MemoryMiB: 16,
		Drives: []snapDrive{{ID: "rootfs", Path: "/a", VMPath: "/a"}}, NICs: []snapNIC{{ID: "eth0", MAC: "02:00:00:00:00:01", TapName: "tap0"}}}
	tests := []struct {
		name   string
		mutate func(*snapshotConfig)
		raw    string
		want   string
	}{
		{"ok", func(*snapshotConfig) {}, "", ""},
		{"other driver", func(c *snapshotConfig) { c.Driver = "qemu" }, "", `driver "qemu"`},
		{"future format", func(c *snapshotConfig) { c.Format = 9 }, "", "format 9"},
		{"bad type", func(c *snapshotConfig) { c.Type = "Half" }, "", "Full or Diff"},
		{"repeated drive", func(c *snapshotConfig) { c.Drives = append(c.Drives, c.Drives[0]) }, "", "repeated"},
		{"nic without tap", func(c *snapshotConfig) { c.NICs[0].TapName = "" }, "", "empty"},
		{"not json", nil, "{", "unexpected end"},
	}
	for _, tc := range tests {
		dir := t.TempDir()
		if tc.mutate != nil {
			c := good
			c.Drives = append([]snapDrive(nil), good.Drives...)
			c.NICs = append([]snapNIC(nil), good.NICs...)
			tc.mutate(&c)
			b, _ := json.Marshal(c)
			tc.raw = string(b)
		}
		if err := os.WriteFile(filepath.Join(dir, vmm.SnapshotConfigFile), []byte(tc.raw), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := readConfig(dir)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.want)
		}
	}
}

func FuzzReadConfig(f *testing.F) {
	f.Add([]byte(`{"driver":"firecracker","format":1,"type":"Full","drives":[{"id":"a","vm_path":"/a"}],"nics":[{"id":"e","tap_name":"t"}]}`))
	f.Add([]byte(`{"driver":"firecracker","format":1,"type":"Diff","drives":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, vmm.SnapshotConfigFile), b, 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := readConfig(dir)
		if err != nil {
			return
		}
		if c.Driver != Name || (c.Type != "Full" && c.Type != "Diff") {
			t.Fatalf("accepted a config that fails its own checks: %+v", c)
		}
	})
}

// newNetNS creates a named network namespace with iproute2 and returns its
// path; it skips when that is impossible here.
func newNetNS(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("creating a network namespace needs root")
	}
	ipPath, err := exec.LookPath("ip")
	if err != nil {
		testenv.Missing(t, "iproute2's ip is not installed")
	}
	name := fmt.Sprintf("aenv-fct-%d-%d", os.Getpid(), time.Now().UnixNano()%1e6)
	if out, err := exec.Command(ipPath, "netns", "add", name).CombinedOutput(); err != nil {
		t.Skipf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command(ipPath, "netns", "del", name).Run() })
	return "/var/run/netns/" + name
}

func TestBootInNetNS(t *testing.T) {
	t.Parallel()
	path := newNetNS(t)
	env := newTestEnv(t)
	d, log := newFakeDriver(t, "", nil)
	cfg := env.config("ns1")
	cfg.NetNS = path
	vm, err := d.Boot(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Stop(context.Background())
	started, _ := findCall(readCalls(t, log), "EXEC", "firecracker")
	var want, here syscall.Stat_t
	if err := syscall.Stat(path, &want); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat("/proc/self/ns/net", &here); err != nil {
		t.Fatal(err)
	}
	got := started.Body["netns"].(string)
	if got != fmt.Sprintf("net:[%d]", want.Ino) {
		t.Errorf("VMM runs in %s, want net:[%d]", got, want.Ino)
	}
	// The driver's own thread went back to where it was.
	var after syscall.Stat_t
	if err := syscall.Stat("/proc/self/ns/net", &after); err != nil || after.Ino != here.Ino {
		t.Errorf("test process namespace changed: %v", err)
	}

	cfg2 := env.config("ns2")
	cfg2.RunDir = filepath.Join(env.dir, "run2")
	cfg2.NetNS = filepath.Join(env.dir, "no-such-netns")
	if _, err := d.Boot(context.Background(), cfg2); err == nil || !strings.Contains(err.Error(), "network namespace") {
		t.Errorf("boot in a missing namespace: %v", err)
	}
	assertNoLeftovers(t, cfg2.RunDir, false)
}

func TestStopKeepsWhatItDidNotCreate(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	d, _ := newFakeDriver(t, "", nil)
	if err := os.MkdirAll(env.runDir, 0o755); err != nil {
		t.Fatal(err)
	}
	foreign := touchFile(t, filepath.Join(env.runDir, "keep-me"), 1)
	cfg := env.config("keep")
	cfg.ConsoleLog = filepath.Join(env.dir, "console-elsewhere.log")
	vm, err := d.Boot(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		b, _ := os.ReadFile(cfg.ConsoleLog)
		return strings.Contains(string(b), "fake guest")
	}, "console output")
	if err := vm.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	assertNoLeftovers(t, env.runDir, true, foreign)
	if _, err := os.Stat(cfg.ConsoleLog); err != nil {
		t.Errorf("console log outside the run dir was removed: %v", err)
	}
}

func TestProbe(t *testing.T) {
	t.Parallel()
	exe, _ := fakeExecutable(t, "firecracker", "firecracker", "")
	version, err := Probe(context.Background(), exe)
	if version != "Firecracker v0.0.0-fake" {
		t.Errorf("version = %q", version)
	}
	if _, statErr := os.Stat("/dev/kvm"); statErr != nil && (err == nil || !strings.Contains(err.Error(), "/dev/kvm")) {
		t.Errorf("probe without /dev/kvm: %v, want an error naming /dev/kvm", err)
	}
	if _, err := Probe(context.Background(), shellFirecracker(t)); err == nil || !strings.Contains(err.Error(), "FailedToBindSocket") {
		t.Errorf("probe of a failing binary: %v", err)
	}
	if _, err := Probe(context.Background(), filepath.Join(t.TempDir(), "nothing")); err == nil {
		t.Error("probe of a missing binary succeeded")
	}
}

func TestFailedSnapshotLeavesNothing(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	d, _ := newFakeDriver(t, "", nil)
	ctx := context.Background()
	vm, err := d.Boot(ctx, env.config("fs"))
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Stop(ctx)
	if err := vm.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	// Bypass SnapshotDiff's own check so Firecracker (the fake) refuses.
	dir := filepath.Join(env.dir, "half")
	_, err = vm.(*Machine).snapshot(ctx, dir, "Diff")
	if err == nil || !strings.Contains(err.Error(), "dirty page tracking") {
		t.Fatalf("diff snapshot without tracking: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("failed snapshot left %s behind: %v", dir, err)
	}
	// The machine is still usable.
	if _, err := vm.Snapshot(ctx, dir); err != nil {
		t.Errorf("snapshot after a failed one: %v", err)
	}
}

func TestShutdownAndFlush(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	d, log := newFakeDriver(t, "", func(o *Options) { o.Metrics = true })
	ctx := context.Background()
	vm, err := d.Boot(ctx, env.config("sd"))
	if err != nil {
		t.Fatal(err)
	}
	m := vm.(*Machine)
	if err := m.FlushMetrics(ctx); err != nil {
		t.Fatal(err)
	}
	pid := vm.Info().PID
	if err := m.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if !processGone(pid) {
		t.Errorf("pid %d runs after Shutdown", pid)
	}
	if err := vm.Wait(ctx); err != nil {
		t.Errorf("wait after a clean guest reboot: %v", err)
	}
	calls := apiCalls(readCalls(t, log))
	noFaults(t, calls)
	var actions []any
	for _, c := range calls {
		if c.Path == "/actions" {
			actions = append(actions, c.Body["action_type"])
		}
	}
	if !jsonEqual(actions, []any{"InstanceStart", "FlushMetrics", "SendCtrlAltDel"}) {
		t.Errorf("actions = %v", actions)
	}
	assertNoLeftovers(t, env.runDir, false)
}
