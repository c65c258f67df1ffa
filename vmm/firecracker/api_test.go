package firecracker

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/firecracker-microvm/firecracker-go-sdk/client/models"
)

// startFake serves a fresh fake VMM on a socket in a temp dir.
func startFake(t *testing.T) (*fakeVMM, *client, string) {
	t.Helper()
	dir := t.TempDir()
	f := newFakeVMM("", &bytes.Buffer{})
	srv, _, err := serveFake(filepath.Join(dir, "api.sock"), f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return f, newClient(filepath.Join(dir, "api.sock")), dir
}

func touchFile(t *testing.T, path string, size int64) string {
	t.Helper()
	if err := os.WriteFile(path, bytes.Repeat([]byte{1}, int(size)), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func sp(s string) *string { return &s }
func bp(b bool) *bool     { return &b }
func ip(n int64) *int64   { return &n }

// apiStep is one client call and the request the fake must have seen.
type apiStep struct {
	name   string
	do     func(ctx context.Context, c *client) error
	method string
	path   string
	body   map[string]any // fields that must be present with these values
	absent []string       // fields that must not be sent
}

// runSteps runs steps in order against one fake: later steps depend on the
// VMM state earlier ones created, as with Firecracker.
func runSteps(t *testing.T, f *fakeVMM, c *client, steps []apiStep) {
	t.Helper()
	ctx := context.Background()
	for _, s := range steps {
		if err := s.do(ctx, c); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		calls := f.recorded()
		last := calls[len(calls)-1]
		if last.Method != s.method || last.Path != s.path {
			t.Fatalf("%s: sent %s %s, want %s %s", s.name, last.Method, last.Path, s.method, s.path)
		}
		if last.Status >= 300 {
			t.Fatalf("%s: fake answered %d: %s", s.name, last.Status, last.Fault)
		}
		for k, want := range s.body {
			if got := last.Body[k]; !jsonEqual(got, want) {
				t.Errorf("%s: body field %s = %#v, want %#v", s.name, k, got, want)
			}
		}
		for _, k := range s.absent {
			if _, ok := last.Body[k]; ok {
				t.Errorf("%s: body has field %s, which must not be sent", s.name, k)
			}
		}
	}
}

// jsonEqual compares a decoded JSON value with a Go literal.
func jsonEqual(got, want any) bool {
	switch w := want.(type) {
	case int:
		g, ok := got.(float64)
		return ok && g == float64(w)
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok || len(g) != len(w) {
			return false
		}
		for k := range w {
			if !jsonEqual(g[k], w[k]) {
				return false
			}
		}
		return true
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return false
		}
		for i := range w {
			if !jsonEqual(g[i], w[i]) {
				return false
			}
		}
		return true
	default:
		return got == want
	}
}

func TestClientBootSequence(t *testing.T) {
	t.Parallel()
	f, c, dir := startFake(t)
	kernel := touchFile(t, filepath.Join(dir, "vmlinux"), 16)
	rootfs := touchFile(t, filepath.Join(dir, "rootfs.ext4"), 16)
	rootfs2 := touchFile(t, filepath.Join(dir, "rootfs2.ext4"), 16)
	logFile := touchFile(t, filepath.Join(dir, "fc.log"), 0)
	snapDir := t.TempDir()
	steps := []apiStep{
		{"logger", func(ctx context.Context, c *client) error {
			return c.putLogger(ctx, &models.Logger{LogPath: sp(logFile), Level: sp("Warning"), ShowLevel: bp(true)})
		}, "PUT", "/logger", map[string]any{"log_path": logFile, "level": "Warning", "show_level": true}, nil},
		{"metrics", func(ctx context.Context, c *client) error {
			return c.putMetrics(ctx, &models.Metrics{MetricsPath: sp(logFile)})
		}, "PUT", "/metrics", map[string]any{"metrics_path": logFile}, nil},
		{"machine-config", func(ctx context.Context, c *client) error {
			return c.putMachineConfig(ctx, &models.MachineConfiguration{VcpuCount: ip(2), MemSizeMib: ip(128), Smt: bp(false), TrackDirtyPages: bp(true)})
		}, "PUT", "/machine-config", map[string]any{"vcpu_count": 2, "mem_size_mib": 128, "smt": false, "track_dirty_pages": true}, []string{"cpu_template"}},
		{"boot-source", func(ctx context.Context, c *client) error {
			return c.putBootSource(ctx, &models.BootSource{KernelImagePath: sp(kernel), BootArgs: "console=ttyS0"})
		}, "PUT", "/boot-source", map[string]any{"kernel_image_path": kernel, "boot_args": "console=ttyS0"}, []string{"initrd_path"}},
		{"drive", func(ctx context.Context, c *client) error {
			return c.putDrive(ctx, &models.Drive{DriveID: sp("rootfs"), PathOnHost: sp(rootfs), IsReadOnly: bp(false), IsRootDevice: bp(false)})
		}, "PUT", "/drives/rootfs", map[string]any{"drive_id": "rootfs", "path_on_host": rootfs, "is_read_only": false, "is_root_device": false}, nil},
		{"nic", func(ctx context.Context, c *client) error {
			return c.putNIC(ctx, &models.NetworkInterface{IfaceID: sp("eth0"), HostDevName: sp("tap0"), GuestMac: "02:00:00:00:00:01"})
		}, "PUT", "/network-interfaces/eth0", map[string]any{"iface_id": "eth0", "host_dev_name": "tap0", "guest_mac": "02:00:00:00:00:01"}, nil},
		{"balloon", func(ctx context.Context, c *client) error {
			return c.putBalloon(ctx, &models.Balloon{AmountMib: ip(0), DeflateOnOom: bp(true), StatsPollingIntervals: 1})
		}, "PUT", "/balloon", map[string]any{"amount_mib": 0, "deflate_on_oom": true, "stats_polling_interval_s": 1}, nil},
		{"mmds config", func(ctx context.Context, c *client) error {
			return c.putMMDSConfig(ctx, &models.MmdsConfig{NetworkInterfaces: []string{"eth0"}, Version: sp("V2")})
		}, "PUT", "/mmds/config", map[string]any{"network_interfaces": []any{"eth0"}, "version": "V2"}, nil},
		{"mmds put", func(ctx context.Context, c *client) error {
			return c.putMMDS(ctx, map[string]any{"a": "1"})
		}, "PUT", "/mmds", map[string]any{"a": "1"}, nil},
		{"mmds patch", func(ctx context.Context, c *client) error {
			return c.patchMMDS(ctx, map[string]any{"b": "2"})
		}, "PATCH", "/mmds", map[string]any{"b": "2"}, nil},
		{"mmds get", func(ctx context.Context, c *client) error {
			got, err := c.getMMDS(ctx)
			if err != nil {
				return err
			}
			if !jsonEqual(got, map[string]any{"a": "1", "b": "2"}) {
				t.Errorf("mmds = %#v", got)
			}
			return nil
		}, "GET", "/mmds", nil, nil},
		{"start", func(ctx context.Context, c *client) error {
			return c.action(ctx, models.InstanceActionInfoActionTypeInstanceStart)
		}, "PUT", "/actions", map[string]any{"action_type": "InstanceStart"}, nil},
		{"pause", func(ctx context.Context, c *client) error { return c.patchVM(ctx, models.VMStatePaused) },
			"PATCH", "/vm", map[string]any{"state": "Paused"}, nil},
		{"describe", func(ctx context.Context, c *client) error {
			info, err := c.describe(ctx)
			if err == nil && *info.State != "Paused" {
				t.Errorf("state = %q, want Paused", *info.State)
			}
			return err
		}, "GET", "/", nil, nil},
		{"snapshot full", func(ctx context.Context, c *client) error {
			return c.createSnapshot(ctx, &models.SnapshotCreateParams{SnapshotPath: sp(filepath.Join(snapDir, "state")), MemFilePath: sp(filepath.Join(snapDir, "memory")), SnapshotType: "Full"})
		}, "PUT", "/snapshot/create", map[string]any{"snapshot_type": "Full", "snapshot_path": filepath.Join(snapDir, "state")}, []string{"version"}},
		{"snapshot diff", func(ctx context.Context, c *client) error {
			return c.createSnapshot(ctx, &models.SnapshotCreateParams{SnapshotPath: sp(filepath.Join(snapDir, "state2")), MemFilePath: sp(filepath.Join(snapDir, "memory2")), SnapshotType: "Diff"})
		}, "PUT", "/snapshot/create", map[string]any{"snapshot_type": "Diff"}, nil},
		{"resume", func(ctx context.Context, c *client) error { return c.patchVM(ctx, models.VMStateResumed) },
			"PATCH", "/vm", map[string]any{"state": "Resumed"}, nil},
		{"balloon patch", func(ctx context.Context, c *client) error { return c.patchBalloon(ctx, 64) },
			"PATCH", "/balloon", map[string]any{"amount_mib": 64}, nil},
		{"balloon stats", func(ctx context.Context, c *client) error {
			st, err := c.balloonStats(ctx)
			if err == nil && (st.TargetMib == nil || *st.TargetMib != 64) {
				t.Errorf("balloon target = %v, want 64", st.TargetMib)
			}
			return err
		}, "GET", "/balloon/statistics", nil, nil},
		{"drive patch", func(ctx context.Context, c *client) error { return c.patchDrive(ctx, "rootfs", rootfs2) },
			"PATCH", "/drives/rootfs", map[string]any{"drive_id": "rootfs", "path_on_host": rootfs2}, nil},
	}
	runSteps(t, f, c, steps)
}

func TestClientLoadSnapshot(t *testing.T) {
	t.Parallel()
	// A snapshot to load, written by a fake that booted.
	src, srcClient, dir := startFake(t)
	kernel := touchFile(t, filepath.Join(dir, "vmlinux"), 16)
	ctx := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(srcClient.putMachineConfig(ctx, &models.MachineConfiguration{VcpuCount: ip(1), MemSizeMib: ip(16)}))
	must(srcClient.putBootSource(ctx, &models.BootSource{KernelImagePath: &kernel}))
	must(srcClient.putNIC(ctx, &models.NetworkInterface{IfaceID: sp("eth0"), HostDevName: sp("tap0")}))
	must(srcClient.action(ctx, models.InstanceActionInfoActionTypeInstanceStart))
	must(srcClient.patchVM(ctx, models.VMStatePaused))
	state, mem := filepath.Join(dir, "state"), filepath.Join(dir, "memory")
	must(srcClient.createSnapshot(ctx, &models.SnapshotCreateParams{SnapshotPath: &state, MemFilePath: &mem}))
	_ = src

	tests := []struct {
		name      string
		overrides []networkOverride
		resume    bool
		want      map[string]any
		absent    []string
	}{
		{"plain resume", nil, true,
			map[string]any{"snapshot_path": state, "resume_vm": true, "mem_backend": map[string]any{"backend_type": "File", "backend_path": mem}},
			[]string{"mem_file_path", "network_overrides"}},
		{"paused", nil, false,
			map[string]any{"snapshot_path": state},
			[]string{"resume_vm", "mem_file_path"}},
		{"tap override", []networkOverride{{IfaceID: "eth0", HostDevName: "tap9"}}, true,
			map[string]any{"network_overrides": []any{map[string]any{"iface_id": "eth0", "host_dev_name": "tap9"}},
				"mem_backend": map[string]any{"backend_type": "File", "backend_path": mem}, "resume_vm": true},
			[]string{"mem_file_path"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, c, _ := startFake(t)
			typ := models.MemoryBackendBackendTypeFile
			lp := loadParams{SnapshotLoadParams: &models.SnapshotLoadParams{
				SnapshotPath: &state, MemBackend: &models.MemoryBackend{BackendType: &typ, BackendPath: &mem}, ResumeVM: tc.resume,
			}, NetworkOverrides: tc.overrides}
			runSteps(t, f, c, []apiStep{{"load", func(ctx context.Context, c *client) error { return c.loadSnapshot(ctx, lp) },
				"PUT", "/snapshot/load", tc.want, tc.absent}})
			info, err := c.describe(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			want := "Paused"
			if tc.resume {
				want = "Running"
			}
			if *info.State != want {
				t.Errorf("state after load = %q, want %q", *info.State, want)
			}
			// Loading twice is refused, and the refusal reaches us as an APIError.
			err = c.loadSnapshot(context.Background(), lp)
			var ae *APIError
			if !errors.As(err, &ae) || ae.Code != http.StatusBadRequest || !strings.Contains(ae.Fault, "not allowed") {
				t.Errorf("second load: %v, want a 400 APIError", err)
			}
		})
	}
}

func TestClientErrors(t *testing.T) {
	t.Parallel()
	_, c, dir := startFake(t)
	ctx := context.Background()
	missing := filepath.Join(dir, "no-such-kernel")
	err := c.putBootSource(ctx, &models.BootSource{KernelImagePath: &missing})
	var ae *APIError
	if !errors.As(err, &ae) || ae.Code != http.StatusBadRequest || !strings.Contains(ae.Fault, "no-such-kernel") {
		t.Fatalf("missing kernel: %v, want APIError naming the file", err)
	}
	if !strings.Contains(err.Error(), "PUT /boot-source") {
		t.Errorf("error %q does not name the operation", err)
	}
	if err := c.patchVM(ctx, models.VMStatePaused); !errors.As(err, &ae) || !strings.Contains(ae.Fault, "before starting") {
		t.Errorf("pause before start: %v", err)
	}
	// GET /mmds before anything was stored is a typed 404.
	if _, err := c.getMMDS(ctx); !errors.As(err, &ae) || ae.Code != http.StatusNotFound {
		t.Errorf("empty mmds: %v, want a 404 APIError", err)
	}
	dead := newClient(filepath.Join(dir, "nobody-listens.sock"))
	if err := dead.action(ctx, "InstanceStart"); err == nil || !strings.Contains(err.Error(), "PUT /actions") {
		t.Errorf("dead socket: %v, want an error naming the operation", err)
	}
}

// TestFakeChecksSpec proves the fake rejects what Firecracker's API
// description forbids, so the client tests above can fail.
func TestFakeChecksSpec(t *testing.T) {
	t.Parallel()
	_, _, dir := startFake(t)
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", filepath.Join(dir, "api.sock"))
	}}}
	tests := []struct {
		method, path, body string
		want               int
		fault              string
	}{
		{"PUT", "/machine-config", `{"vcpu_count": 2}`, 400, "missing required field mem_size_mib"},
		{"PUT", "/machine-config", `{"vcpu_count": 33, "mem_size_mib": 128}`, 400, "out of range"},
		{"PUT", "/machine-config", `{"vcpu_count": 1, "mem_size_mib": 128, "bogus": 1}`, 400, "unknown field bogus"},
		{"PUT", "/drives/a", `{"drive_id": "a", "is_root_device": "yes"}`, 400, "want a boolean"},
		{"PUT", "/drives/a", `{"drive_id": "a", "is_root_device": false, "cache_type": "Fast"}`, 400, "not one of"},
		{"PUT", "/actions", `{"action_type": "Reboot"}`, 400, "not one of"},
		{"PATCH", "/vm", `{"state": "Stopped"}`, 400, "not one of"},
		{"PUT", "/snapshot/create", `{"snapshot_path": "/x", "mem_file_path": "/y", "version": "1.0"}`, 400, "unknown field version"},
		{"PUT", "/snapshot/load", `{"snapshot_path": "/x", "mem_backend": {"backend_type": "Mmap", "backend_path": "/y"}}`, 400, "not one of"},
		{"PUT", "/snapshot/load", `{"snapshot_path": "/x", "mem_file_path": "/y", "mem_backend": {"backend_type": "File", "backend_path": "/y"}}`, 400, "exactly one"},
		{"POST", "/vm", `{"state": "Paused"}`, 405, "not an operation"},
		{"PUT", "/nowhere", `{}`, 404, "no path"},
	}
	for _, tc := range tests {
		req, _ := http.NewRequest(tc.method, "http://localhost"+tc.path, strings.NewReader(tc.body))
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		_, _ = buf.ReadFrom(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != tc.want || !strings.Contains(buf.String(), tc.fault) {
			t.Errorf("%s %s %s: %d %s, want %d with %q", tc.method, tc.path, tc.body, resp.StatusCode, buf.String(), tc.want, tc.fault)
		}
	}
}
