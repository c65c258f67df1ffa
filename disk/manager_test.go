package disk

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
)

// TestManagerOnLocalDaemon runs the node's disk operations on the daemon
// in process: a root disk attached over its NBD socket, two seals of one
// generation (the second gets a name of its own), the copy into a snapshot
// directory, a restart of the daemon that serves the device again on the
// same socket, and reclaim of a device no record holds.
func TestManagerOnLocalDaemon(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	state, dir := t.TempDir(), t.TempDir()
	l, err := StartLocal(ctx, state, nil)
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(dir, "base")
	if err := BlankLayer(ctx, base, 1<<20); err != nil {
		t.Fatal(err)
	}
	m, err := New(ctx, Options{Devices: l.Devices(), Backend: "local"})
	if err != nil {
		t.Fatal(err)
	}
	if m.Backend() != "local" || m.Transport() == "" {
		t.Fatalf("backend %q, transport %q", m.Backend(), m.Transport())
	}
	drive, dev, err := m.Attach(ctx, "s1", base+".json", nil)
	if err != nil {
		t.Fatal(err)
	}
	if drive.ID != RootfsDrive || (drive.NBD == nil && drive.Path == "") {
		t.Fatalf("root drive %+v: want the rootfs drive reachable over NBD or a block device", drive)
	}
	h := Held{Owner: "s1", Dir: dir, Device: dev, Has: true}
	first, err := m.Seal(ctx, h, "rootfs-1", "test", KeepUpper)
	if err != nil {
		t.Fatal(err)
	}
	second, err := m.Seal(ctx, h, "rootfs-1", "test", KeepUpper)
	if err != nil {
		t.Fatal(err)
	}
	if first != filepath.Join(dir, "rootfs-1.json") || second != filepath.Join(dir, "rootfs-1.1.json") {
		t.Fatalf("seals wrote %s and %s: want rootfs-1.json, then rootfs-1.1.json", first, second)
	}
	if layers := snapshot.Refs(second); len(layers) != 2 || layers[0] != base+".lsmt" {
		t.Fatalf("sealed config lists %v: want the base and one sealed layer", layers)
	}
	snap := t.TempDir()
	cfg, err := m.CopyInto(second, dir, snap)
	if err != nil {
		t.Fatal(err)
	}
	if layers := snapshot.Refs(cfg); len(layers) != 2 || filepath.Dir(layers[1]) != snap {
		t.Fatalf("snapshot config lists %v: want the sandbox's layer adopted into %s", layers, snap)
	}
	socket := deviceSocket(ctx, t, l.Devices(), dev)

	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if l, err = StartLocal(ctx, state, nil); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	m, err = New(ctx, Options{Devices: l.Devices()})
	if err != nil {
		t.Fatal(err)
	}
	if again := deviceSocket(ctx, t, l.Devices(), dev); again != socket {
		t.Fatalf("after a restart the device is served on %q, want %q (where its VM reconnects)", again, socket)
	}
	if _, err := os.Stat(socket); err != nil {
		t.Fatalf("export socket after a restart: %v", err)
	}
	if err := m.Reclaim(ctx, map[uint32]string{dev: "s1"}); err != nil || deviceSocket(ctx, t, l.Devices(), dev) == "" {
		t.Fatalf("reclaim deleted a held device (%v)", err)
	}
	if err := m.Reclaim(ctx, nil); err != nil || deviceSocket(ctx, t, l.Devices(), dev) != "" {
		t.Fatalf("reclaim kept a device no record holds (%v)", err)
	}
	if err := m.DeleteDevices(ctx, "s1", []uint32{dev}); err != nil {
		t.Fatalf("delete of a device already gone: %v", err)
	}
}

// deviceSocket returns the export socket of active device id ("" when the
// daemon has no such device).
func deviceSocket(ctx context.Context, t *testing.T, sd Devices, id uint32) string {
	t.Helper()
	devs, err := sd.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		if d.ID == id {
			if d.State != rpc.StateActive || d.Socket == "" {
				t.Fatalf("device %d: %+v, want active with a socket", id, d)
			}
			return d.Socket
		}
	}
	return ""
}
