package firecracker

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentenv/agentenv/vmm"
)

func newJailedDriver(t *testing.T, base string) (*Driver, string) {
	t.Helper()
	fc, _ := fakeExecutable(t, "firecracker", "firecracker", "")
	jailer, log := fakeExecutable(t, "jailer", "jailer", "")
	d, err := New(Options{
		Binary: fc, StartTimeout: 3 * time.Second, Log: slog.New(slog.DiscardHandler),
		Jailer: &JailerOptions{
			Binary: jailer, ChrootBase: base, UID: 1234, GID: 1235,
			NetNS: "/var/run/netns/sbx1", CgroupVersion: 2, Cgroups: []string{"cpu.max=100000 100000"},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return d, log
}

func TestJailer(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("the jailer layout chowns files for the jail user: needs root")
	}
	env := newTestEnv(t)
	base := filepath.Join(t.TempDir(), "jail")
	d, log := newJailedDriver(t, base)
	ctx := context.Background()
	vm, err := d.Boot(ctx, env.config("jail-1"))
	if err != nil {
		t.Fatal(err)
	}
	chroot := filepath.Join(base, "firecracker", "jail-1")
	if got, want := vm.Info().ControlSocket, filepath.Join(chroot, "root", socketName); got != want {
		t.Errorf("control socket %s, want %s", got, want)
	}
	calls := readCalls(t, log)
	noFaults(t, calls)
	exec, ok := findCall(calls, "EXEC", "jailer")
	if !ok {
		t.Fatal("jailer not run")
	}
	wantArgs := map[string]any{
		"id": []any{"jail-1"}, "uid": []any{"1234"}, "gid": []any{"1235"}, "chroot-base-dir": []any{base},
		"netns": []any{"/var/run/netns/sbx1"}, "cgroup-version": []any{"2"}, "cgroup": []any{"cpu.max=100000 100000"},
	}
	for k, v := range wantArgs {
		if !jsonEqual(exec.Body[k], v) {
			t.Errorf("jailer --%s = %v, want %v", k, exec.Body[k], v)
		}
	}
	// Inside the chroot everything has a stable name.
	boot, _ := findCall(calls, "PUT", "/boot-source")
	root, _ := findCall(calls, "PUT", "/drives/rootfs")
	logger, _ := findCall(calls, "PUT", "/logger")
	if boot.Body["kernel_image_path"] != "/kernel" || root.Body["path_on_host"] != "/drive-rootfs" || logger.Body["log_path"] != "/"+logName {
		t.Errorf("chroot paths: kernel %v, rootfs %v, log %v", boot.Body["kernel_image_path"], root.Body["path_on_host"], logger.Body["log_path"])
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(chroot, "root", "drive-rootfs"), &st); err != nil || st.Uid != 1234 || st.Gid != 1235 {
		t.Errorf("writable drive in chroot: %v, owner %d:%d, want 1234:1235", err, st.Uid, st.Gid)
	}

	if err := vm.Pause(ctx); err != nil {
		t.Fatal(err)
	}
	snapDir := filepath.Join(env.dir, "snap")
	snap, err := vm.Snapshot(ctx, snapDir)
	if err != nil {
		t.Fatal(err)
	}
	if snap.MemBytes != 32<<20 {
		t.Errorf("memory file %d bytes, want 32 MiB", snap.MemBytes)
	}
	var mst syscall.Stat_t
	if err := syscall.Stat(snap.MemoryFile, &mst); err != nil || mst.Uid != 0 || mst.Gid != 1235 || mst.Mode&0o777 != 0o640 {
		t.Errorf("snapshot memory file: %v, owner %d:%d mode %o; want root:1235 0640", err, mst.Uid, mst.Gid, mst.Mode&0o777)
	}
	for _, leftover := range []string{"snapshot-state", "snapshot-memory"} {
		if _, err := os.Stat(filepath.Join(chroot, "root", leftover)); !os.IsNotExist(err) {
			t.Errorf("%s still in the chroot: %v", leftover, err)
		}
	}
	if err := vm.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(chroot); !os.IsNotExist(err) {
		t.Errorf("chroot %s left behind: %v", chroot, err)
	}

	// A restore in another chroot uses a different upper under the same
	// in-chroot name, without patching drives.
	upper := touchFile(t, filepath.Join(env.dir, "upper.ext4"), 4096)
	d2, log2 := newJailedDriver(t, base)
	clone, err := d2.Restore(ctx, vmm.RestoreConfig{ID: "jail-2", SnapshotDir: snapDir, RunDir: filepath.Join(env.dir, "run2"),
		Drives: []vmm.Drive{{ID: "rootfs", Path: upper}}})
	if err != nil {
		t.Fatal(err)
	}
	calls = readCalls(t, log2)
	noFaults(t, calls)
	load, _ := findCall(calls, "PUT", "/snapshot/load")
	if !jsonEqual(load.Body["mem_backend"], map[string]any{"backend_type": "File", "backend_path": "/memory"}) || load.Body["snapshot_path"] != "/state" {
		t.Errorf("load body %v", load.Body)
	}
	if _, patched := findCall(calls, "PATCH", "/drives/rootfs"); patched {
		t.Error("jailed restore patched a drive; the stable in-chroot name should make that unnecessary")
	}
	linked, err1 := os.Stat(filepath.Join(base, "firecracker", "jail-2", "root", "drive-rootfs"))
	orig, err2 := os.Stat(upper)
	if err1 != nil || err2 != nil || !os.SameFile(linked, orig) {
		t.Errorf("drive-rootfs in the clone's chroot is not the new upper (%v, %v)", err1, err2)
	}
	if err := clone.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(base, "firecracker", "jail-2")); !os.IsNotExist(err) {
		t.Errorf("clone chroot left behind: %v", err)
	}
}

func TestJailerUnreadableFile(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("the jailer layout chowns files for the jail user: needs root")
	}
	env := newTestEnv(t)
	if err := os.Chmod(env.kernel, 0o600); err != nil {
		t.Fatal(err)
	}
	d, _ := newJailedDriver(t, filepath.Join(t.TempDir(), "jail"))
	_, err := d.Boot(context.Background(), env.config("unreadable"))
	if err == nil || !strings.Contains(err.Error(), "not readable by the jail's uid 1234") {
		t.Fatalf("boot with a kernel the jail cannot read: %v", err)
	}
	assertNoLeftovers(t, env.runDir, false)
}

func TestJailerIDWithUnderscore(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("the jailer layout chowns files for the jail user: needs root")
	}
	env := newTestEnv(t)
	base := filepath.Join(t.TempDir(), "jail")
	d, log := newJailedDriver(t, base)
	ctx := context.Background()
	cfg := env.config("sbx_1")
	// The fake jailer does not join it; any existing path will do.
	cfg.NetNS = touchFile(t, filepath.Join(env.dir, "netns-handle"), 0)
	vm, err := d.Boot(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer vm.Stop(ctx)
	exec, _ := findCall(readCalls(t, log), "EXEC", "jailer")
	if !jsonEqual(exec.Body["id"], []any{"sbx-1"}) {
		t.Errorf("jailer --id = %v, want sbx-1", exec.Body["id"])
	}
	if !jsonEqual(exec.Body["netns"], []any{cfg.NetNS}) {
		t.Errorf("jailer --netns = %v, want the machine's %s over the driver's default", exec.Body["netns"], cfg.NetNS)
	}
	// A second machine whose ID maps to the same jail is refused, not mixed up.
	env2 := newTestEnv(t)
	_, err = d.Boot(ctx, env2.config("sbx-1"))
	if err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("second machine in the same jail: %v", err)
	}
	assertNoLeftovers(t, env2.runDir, false)
}

func TestJailedSnapshotNeedsJailer(t *testing.T) {
	t.Parallel()
	env := newTestEnv(t)
	d, _ := newFakeDriver(t, "", nil)
	snapDir := bootAndSnapshot(t, d, env, "direct", false)
	jd, _ := newJailedDriver(t, filepath.Join(t.TempDir(), "jail"))
	_, err := jd.Restore(context.Background(), vmm.RestoreConfig{ID: "j", SnapshotDir: snapDir, RunDir: filepath.Join(t.TempDir(), "r")})
	if err == nil || !strings.Contains(err.Error(), "jailer=false cannot be restored with jailer=true") {
		t.Fatalf("restoring a direct snapshot under the jailer: %v", err)
	}
}
