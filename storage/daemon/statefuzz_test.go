package daemon

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/storage/daemon/rpc"
)

// stateFixture is a scratch daemon's directory holding one device made from
// fx, with the daemon stopped: the on-disk state a restart reads.
func stateFixture(t *testing.T, fx *fixture) (Options, *record) {
	t.Helper()
	opts := fuzzOptions(t.TempDir())
	opts.Socket = ""
	d, ctx, stop := openScratch(t, opts)
	dev, err := d.create(ctx, rpc.CreateParams{Image: fx.config, Owner: "fuzz"})
	if err != nil {
		t.Fatal(err)
	}
	stop()
	r, err := loadRecord(d.deviceDir(dev.ID))
	if err != nil {
		t.Fatal(err)
	}
	return opts, r
}

// checkRestart restarts the daemon on opts and checks that it holds device
// id (served or lost, never dropped) and that the fixture's lower is intact.
func checkRestart(t *testing.T, opts Options, fx *fixture, id uint32) rpc.Device {
	t.Helper()
	before, err := os.ReadFile(fx.base)
	if err != nil {
		t.Fatal(err)
	}
	d, _, stop := openScratch(t, opts)
	defer stop()
	var found *rpc.Device
	for _, dv := range d.list().Devices {
		if dv.ID == id {
			found = &dv
		}
	}
	if found == nil {
		t.Fatalf("device %d is gone after the restart: %+v", id, d.list().Devices)
	}
	if after, err := os.ReadFile(fx.base); err != nil || !bytes.Equal(after, before) {
		t.Fatalf("the device's lower %s changed across the restart (%v)", fx.base, err)
	}
	return *found
}

// TestRollBackKeepsNamedLayers: a restack journal whose layer is a file a
// device record names (here the device's own lower) is rolled back without
// removing it: the journal is not trusted to delete a lower. Before the fix
// the roll back removed the lower and the device was lost.
func TestRollBackKeepsNamedLayers(t *testing.T) {
	fx := newFixture(t, 5)
	opts, r := stateFixture(t, fx)
	ddir := (&Daemon{opts: opts}).deviceDir(r.ID)
	j := &restackJournal{Step: stepSealed, From: r.Gen, Gen: r.Gen + 1, Layer: fx.base, Config: genConfig(ddir, r.Gen+1)}
	if err := writeJournal(ddir, j); err != nil {
		t.Fatal(err)
	}
	if dv := checkRestart(t, opts, fx, r.ID); dv.State != rpc.StateActive {
		t.Fatalf("device after the roll back: %s (%s), want active", dv.State, dv.LostReason)
	}
	if _, err := os.Stat(filepath.Join(ddir, journalName)); !os.IsNotExist(err) {
		t.Fatalf("the journal outlives its roll back: %v", err)
	}
}

// FuzzStateFiles: whatever a device record, a restack journal or the warm
// pool's file holds, a restarting daemon opens, keeps the device (served or
// reported lost, with its directory) and never removes or changes the
// device's lower, a file outside its state directory.
func FuzzStateFiles(f *testing.F) {
	rec, _ := json.Marshal(record{ID: 1, Kind: rpc.KindRuntime, Gen: 1, Layers: []string{"/nonexistent/base.lsmt"}})
	f.Add(byte(0), rec)
	f.Add(byte(0), []byte(`{"id":1,"gen":-5,"layers":[""],"config":"/"}`))
	f.Add(byte(1), []byte(`{"step":"begun","from":1,"gen":2,"layer":"/nonexistent","config":"x"}`))
	f.Add(byte(1), []byte(`{"step":"sealed","from":1,"gen":1}`))
	f.Add(byte(2), []byte(`[{"image":"x","size":-1,"low":99999999,"high":-3}]`))
	f.Add(byte(2), []byte(`{`))
	fx := newFixture(f, 6)
	f.Fuzz(func(t *testing.T, which byte, content []byte) {
		if bytes.Contains(content, []byte(filepath.Dir(fx.base))) {
			return // names the fixture's files: what it may do to them is not the question
		}
		opts, r := stateFixture(t, fx)
		ddir := (&Daemon{opts: opts}).deviceDir(r.ID)
		file := []string{filepath.Join(ddir, "device.json"), filepath.Join(ddir, journalName),
			filepath.Join(opts.StateDir, "pool.json")}[int(which)%3]
		if err := os.WriteFile(file, content, 0o600); err != nil {
			t.Fatal(err)
		}
		dv := checkRestart(t, opts, fx, r.ID)
		if _, err := os.Stat(ddir); dv.State == rpc.StateLost && err != nil {
			t.Fatalf("a lost device's directory is gone: %v", err)
		}
	})
}
