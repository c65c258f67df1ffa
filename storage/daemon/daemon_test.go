package daemon

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agentenv/agentenv/storage/daemon/client"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/image"
	"github.com/agentenv/agentenv/storage/nbd"
)

const diskSize = 8 << 20

// fixture is a sealed base layer with known content and an image config on it.
type fixture struct {
	dir    string
	config string // image config with one lower
	base   string // the sealed layer
	want   []byte // its content
}

func newFixture(t testing.TB, seed uint64) *fixture {
	t.Helper()
	dir := t.TempDir()
	f := &fixture{dir: dir, want: make([]byte, diskSize)}
	r := rand.New(rand.NewPCG(seed, 9))
	for off := 0; off < diskSize; off += 1 << 20 {
		for i := off; i < off+256<<10; i++ {
			f.want[i] = byte(r.Uint32())
		}
	}
	raw := filepath.Join(dir, "base.raw")
	if err := os.WriteFile(raw, f.want, 0o600); err != nil {
		t.Fatal(err)
	}
	f.base = filepath.Join(dir, "base.lsmt")
	if _, err := image.ImportRaw(context.Background(), raw, f.base, image.CommitOptions{}); err != nil {
		t.Fatal(err)
	}
	f.config = filepath.Join(dir, "image.json")
	cfg := image.Config{Lowers: []image.LayerRef{{File: "base.lsmt"}}}
	if err := cfg.Save(f.config); err != nil {
		t.Fatal(err)
	}
	return f
}

type harness struct {
	t      *testing.T
	opts   Options
	cancel context.CancelFunc
	done   chan error
	c      *client.Client
}

func testOptions(t *testing.T) Options {
	dir := t.TempDir()
	return Options{
		Socket:   filepath.Join(dir, "run", "storaged.sock"),
		StateDir: filepath.Join(dir, "state"),
		RunDir:   filepath.Join(dir, "run"),
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// start runs a daemon with opts until the test ends or stop is called.
func start(t *testing.T, opts Options) *harness {
	t.Helper()
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, opts: opts, cancel: cancel, done: make(chan error, 1)}
	go func() { h.done <- d.Run(ctx) }()
	for i := 0; ; i++ {
		c, err := client.Dial(ctx, opts.Socket)
		if err == nil {
			h.c = c
			break
		}
		select {
		case err := <-h.done:
			t.Fatalf("daemon exited: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Cleanup(h.stop)
	return h
}

func (h *harness) stop() {
	if h.c == nil {
		return
	}
	h.c.Close()
	h.c = nil
	h.cancel()
	if err := <-h.done; err != nil {
		h.t.Errorf("daemon run: %v", err)
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func dialDev(t *testing.T, dev rpc.Device) *nbd.Client {
	t.Helper()
	c, err := nbd.Dial(ctxT(t), "unix", dev.Socket, dev.Export)
	if err != nil {
		t.Fatalf("dial device %d: %v", dev.ID, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func readAll(t *testing.T, r io.ReaderAt, size int64) []byte {
	t.Helper()
	b := make([]byte, size)
	if _, err := r.ReadAt(b, 0); err != nil {
		t.Fatal(err)
	}
	return b
}

func isCode(err error, code string) bool { return errors.Is(err, &rpc.Error{Code: code}) }

func TestFeatures(t *testing.T) {
	t.Parallel()
	h := start(t, testOptions(t))
	f, err := h.c.Features(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if f.ProtocolVersion != rpc.ProtocolVersion || !slices.Contains(f.Exports, "nbd") || !f.Restack || !f.SharedDevices || !f.WarmPool {
		t.Fatalf("features %+v", f)
	}
	if err := h.c.Call(ctxT(t), "no-such-method", nil, nil); !isCode(err, rpc.CodeInvalid) {
		t.Fatalf("unknown method: %v", err)
	}
}

// TestCreateWriteRestack writes through NBD, restacks twice with the client
// connected, and checks the sealed layers hold exactly the writes.
func TestCreateWriteRestack(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1)
	h := start(t, testOptions(t))
	ctx := ctxT(t)
	dev, err := h.c.Create(ctx, rpc.CreateParams{Image: f.config, Owner: "sb-1"})
	if err != nil {
		t.Fatal(err)
	}
	if dev.Kind != rpc.KindRuntime || dev.ReadOnly || dev.Size != diskSize || dev.State != rpc.StateActive {
		t.Fatalf("device %+v", dev)
	}
	nc := dialDev(t, dev)
	if got := readAll(t, nc, diskSize); !bytes.Equal(got, f.want) {
		t.Fatal("fresh device does not read as its base layer")
	}
	want := slices.Clone(f.want)
	write := func(off int64, s string) {
		if _, err := nc.WriteAt([]byte(s), off); err != nil {
			t.Fatal(err)
		}
		copy(want[off:], s)
	}
	write(4096, "first generation")
	res1, err := h.c.Restack(ctx, rpc.RestackParams{ID: dev.ID, Message: "one"})
	if err != nil {
		t.Fatal(err)
	}
	checkDigest(t, res1)
	// The same NBD connection keeps working on the new stack.
	write(1<<20, "second generation")
	if got := readAll(t, nc, diskSize); !bytes.Equal(got, want) {
		t.Fatal("device content wrong after restack")
	}
	res2, err := h.c.Restack(ctx, rpc.RestackParams{ID: dev.ID, Layer: filepath.Join(t.TempDir(), "l2.lsmt")})
	if err != nil {
		t.Fatal(err)
	}
	if len(res2.Device.Layers) != 3 || res2.Device.Layers[2] != res2.Layer {
		t.Fatalf("layers after two restacks: %v", res2.Device.Layers)
	}
	// The sealed stack alone reproduces the device.
	im, err := image.OpenLayers(ctx, []string{f.base, res1.Layer, res2.Layer}, image.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	if got := readAll(t, im, diskSize); !bytes.Equal(got, want) {
		t.Fatal("sealed layers do not reproduce the device")
	}
	// The first layer holds only the first generation's write.
	im1, err := image.OpenLayers(ctx, []string{f.base, res1.Layer}, image.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer im1.Close()
	got := readAll(t, im1, diskSize)
	if !bytes.Equal(got[4096:4112], []byte("first generation")) || !bytes.Equal(got[1<<20:1<<20+17], f.want[1<<20:1<<20+17]) {
		t.Fatal("first sealed layer holds the wrong writes")
	}
	if err := h.c.Delete(ctx, dev.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := nbd.Dial(ctx, "unix", dev.Socket, dev.Export); err == nil {
		t.Fatal("deleted device still exported")
	}
	if err := h.c.Delete(ctx, dev.ID); !isCode(err, rpc.CodeNotFound) {
		t.Fatalf("second delete: %v", err)
	}
}

func checkDigest(t *testing.T, r rpc.RestackResult) {
	t.Helper()
	b, err := os.ReadFile(r.Layer)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	if r.Digest != "sha256:"+hex.EncodeToString(sum[:]) || r.Size != int64(len(b)) {
		t.Fatalf("restack result %+v does not match the layer file (%d bytes)", r, len(b))
	}
}

func TestCreateOptionsAndErrors(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2)
	h := start(t, testOptions(t))
	ctx := ctxT(t)
	ro, err := h.c.Create(ctx, rpc.CreateParams{Image: f.config, ReadOnly: true, TCP: true})
	if err != nil {
		t.Fatal(err)
	}
	nc := dialDev(t, ro)
	if !nc.ReadOnly() {
		t.Fatal("read-only device is writable")
	}
	if _, err := nc.WriteAt([]byte("x"), 0); err == nil {
		t.Fatal("write to read-only device succeeded")
	}
	tc, err := nbd.Dial(ctx, "tcp", ro.TCP, ro.Export)
	if err != nil {
		t.Fatalf("loopback tcp export: %v", err)
	}
	if got := readAll(t, tc, diskSize); !bytes.Equal(got, f.want) {
		t.Fatal("tcp export content differs")
	}
	tc.Close()
	if _, err := h.c.Restack(ctx, rpc.RestackParams{ID: ro.ID}); !errors.Is(err, rpc.ErrConflict) {
		t.Fatalf("restack of read-only device: %v", err)
	}
	big, err := h.c.Create(ctx, rpc.CreateParams{Image: f.config, Size: 2 * diskSize})
	if err != nil {
		t.Fatal(err)
	}
	if big.Size != 2*diskSize || dialDev(t, big).Size() != 2*diskSize {
		t.Fatalf("requested size not honoured: %+v", big)
	}
	withUpper := filepath.Join(f.dir, "with-upper.json")
	if _, err := image.Create(ctx, withUpper, image.CreateSpec{Lowers: []string{f.base}}); err != nil {
		t.Fatal(err)
	}
	bad := []rpc.CreateParams{
		{Image: ""},
		{Image: filepath.Join(f.dir, "missing.json")},
		{Image: f.config, Size: 1000},
		{Image: withUpper},
	}
	for _, p := range bad {
		if _, err := h.c.Create(ctx, p); !isCode(err, rpc.CodeInvalid) {
			t.Errorf("create %+v: %v, want invalid", p, err)
		}
	}
	// Ids are reused smallest-first.
	if err := h.c.Delete(ctx, ro.ID); err != nil {
		t.Fatal(err)
	}
	again, err := h.c.Create(ctx, rpc.CreateParams{Image: f.config, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if again.ID != ro.ID || again.Export == ro.Export {
		t.Fatalf("reused id %d (want %d) with export %s (want a new name)", again.ID, ro.ID, again.Export)
	}
}

func TestSharedDevice(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3)
	h := start(t, testOptions(t))
	ctx := ctxT(t)
	a, err := h.c.AcquireShared(ctx, f.config, "vm-a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := h.c.AcquireShared(ctx, f.config, "vm-b")
	if err != nil {
		t.Fatal(err)
	}
	if a.ID != b.ID || a.Socket != b.Socket || !b.ReadOnly || len(b.Holders) != 2 {
		t.Fatalf("two acquires: %+v / %+v", a, b)
	}
	if got := readAll(t, dialDev(t, b), diskSize); !bytes.Equal(got, f.want) {
		t.Fatal("shared device content differs")
	}
	if err := h.c.Delete(ctx, a.ID); !isCode(err, rpc.CodeConflict) {
		t.Fatalf("delete of a shared device: %v", err)
	}
	if err := h.c.ReleaseShared(ctx, a.ID, "vm-a"); err != nil {
		t.Fatal(err)
	}
	if err := h.c.ReleaseShared(ctx, a.ID, "vm-a"); !isCode(err, rpc.CodeNotFound) {
		t.Fatalf("double release: %v", err)
	}
	dialDev(t, b) // still exported for vm-b
	if err := h.c.ReleaseShared(ctx, a.ID, "vm-b"); err != nil {
		t.Fatal(err)
	}
	if _, err := nbd.Dial(ctx, "unix", b.Socket, b.Export); err == nil {
		t.Fatal("shared device exported after its last release")
	}
	devs, _ := h.c.List(ctx)
	if len(devs) != 0 {
		t.Fatalf("devices left: %+v", devs)
	}
}

func TestReclaim(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 4)
	h := start(t, testOptions(t))
	ctx := ctxT(t)
	keep, _ := h.c.Create(ctx, rpc.CreateParams{Image: f.config, Owner: "aenvd"})
	drop, _ := h.c.Create(ctx, rpc.CreateParams{Image: f.config, Owner: "aenvd"})
	other, _ := h.c.Create(ctx, rpc.CreateParams{Image: f.config, Owner: "someone-else"})
	sh, _ := h.c.AcquireShared(ctx, f.config, "aenvd/sb-1")
	h.c.AcquireShared(ctx, f.config, "other/sb-2")
	res, err := h.c.Reclaim(ctx, "aenvd", keep.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Deleted, []uint32{drop.ID}) || !slices.Equal(res.Released, []uint32{sh.ID}) {
		t.Fatalf("reclaim %+v", res)
	}
	devs, _ := h.c.List(ctx)
	var ids []uint32
	for _, d := range devs {
		ids = append(ids, d.ID)
		if d.ID == sh.ID && !slices.Equal(d.Holders, []string{"other/sb-2"}) {
			t.Fatalf("shared holders after reclaim: %v", d.Holders)
		}
	}
	if !slices.Equal(ids, []uint32{keep.ID, other.ID, sh.ID}) {
		t.Fatalf("devices after reclaim: %v", ids)
	}
}

// TestClientDeathKeepsDevices: a client that goes away leaves its devices
// exported; a new client sees and uses them.
func TestClientDeathKeepsDevices(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 5)
	h := start(t, testOptions(t))
	c1, err := client.Dial(ctxT(t), h.opts.Socket)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := c1.Create(ctxT(t), rpc.CreateParams{Image: f.config})
	if err != nil {
		t.Fatal(err)
	}
	c1.Close()
	devs, err := h.c.List(ctxT(t))
	if err != nil || len(devs) != 1 || devs[0].ID != dev.ID {
		t.Fatalf("devices after client death: %+v %v", devs, err)
	}
	dialDev(t, dev)
}

// TestRestart: a restarted daemon re-exports devices with their data, and
// reports lost the ones whose layers changed instead of serving them.
func TestRestart(t *testing.T) {
	t.Parallel()
	good, changed := newFixture(t, 6), newFixture(t, 7)
	opts := testOptions(t)
	h := start(t, opts)
	ctx := ctxT(t)
	a, err := h.c.Create(ctx, rpc.CreateParams{Image: good.config, Owner: "x"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := h.c.Create(ctx, rpc.CreateParams{Image: changed.config})
	if err != nil {
		t.Fatal(err)
	}
	sh, err := h.c.AcquireShared(ctx, good.config, "vm")
	if err != nil {
		t.Fatal(err)
	}
	nc := dialDev(t, a)
	if _, err := nc.WriteAtFUA([]byte("survives restart"), 12345); err != nil {
		t.Fatal(err)
	}
	h.stop()

	// Rewrite the other device's base layer with different content.
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(changed.base, later, later); err != nil {
		t.Fatal(err)
	}
	h2 := start(t, opts)
	devs, err := h2.c.List(ctx)
	if err != nil || len(devs) != 3 {
		t.Fatalf("devices after restart: %+v %v", devs, err)
	}
	byID := map[uint32]rpc.Device{}
	for _, d := range devs {
		byID[d.ID] = d
	}
	if d := byID[a.ID]; d.State != rpc.StateActive || d.Socket != a.Socket || d.Export != a.Export || d.Owner != "x" {
		t.Fatalf("device a after restart: %+v", d)
	}
	got := make([]byte, 16)
	if _, err := dialDev(t, a).ReadAt(got, 12345); err != nil || string(got) != "survives restart" {
		t.Fatalf("data after restart: %q %v", got, err)
	}
	if d := byID[sh.ID]; d.State != rpc.StateActive || d.Kind != rpc.KindShared || !slices.Equal(d.Holders, []string{"vm"}) {
		t.Fatalf("shared device after restart: %+v", d)
	}
	if d := byID[b.ID]; d.State != rpc.StateLost || d.LostReason == "" || d.Socket != "" {
		t.Fatalf("device with a changed layer: %+v", d)
	}
	if _, err := nbd.Dial(ctx, "unix", b.Socket, b.Export); err == nil {
		t.Fatal("a lost device is still served")
	}
	if _, err := h2.c.Restack(ctx, rpc.RestackParams{ID: b.ID}); !isCode(err, rpc.CodeLost) {
		t.Fatalf("restack of lost device: %v", err)
	}
	if err := h2.c.Delete(ctx, b.ID); err != nil {
		t.Fatalf("delete lost device: %v", err)
	}
	// The shared device is found again by image, not duplicated.
	again, err := h2.c.AcquireShared(ctx, good.config, "vm2")
	if err != nil || again.ID != sh.ID {
		t.Fatalf("acquire after restart: %+v %v", again, err)
	}
}

func TestSecondDaemonRefused(t *testing.T) {
	t.Parallel()
	opts := testOptions(t)
	start(t, opts)
	opts2 := opts
	opts2.Socket = filepath.Join(t.TempDir(), "other.sock")
	d2, err := New(opts2)
	if err != nil {
		t.Fatal(err)
	}
	if err := d2.Run(ctxT(t)); err == nil {
		t.Fatal("a second daemon ran on the same state directory")
	}
}

func TestWarmPool(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 8)
	opts := testOptions(t)
	h := start(t, opts)
	ctx := ctxT(t)
	if err := h.c.Warm(ctx, rpc.WarmParams{Image: f.config, Low: 1, High: 2}); err != nil {
		t.Fatal(err)
	}
	pool := waitPool(t, h.c, 2)
	dev, err := h.c.Create(ctx, rpc.CreateParams{Image: f.config, Owner: "sb"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(pool, dev.ID) || dev.Kind != rpc.KindRuntime || dev.Owner != "sb" {
		t.Fatalf("create did not take a pool device: %+v (pool %v)", dev, pool)
	}
	if got := readAll(t, dialDev(t, dev), diskSize); !bytes.Equal(got, f.want) {
		t.Fatal("pool device content differs")
	}
	// Below the low watermark? 1 left == low, so no refill yet; take another.
	if _, err := h.c.Create(ctx, rpc.CreateParams{Image: f.config}); err != nil {
		t.Fatal(err)
	}
	waitPool(t, h.c, 2) // refilled in the background to the high watermark

	// A restarted daemon adopts the pool devices and keeps the watermarks
	// (the daemon defaults are 0/0, so only the saved config refills).
	h.stop()
	h2 := start(t, opts)
	pool = waitPool(t, h2.c, 2)
	for range 2 {
		dev, err := h2.c.Create(ctx, rpc.CreateParams{Image: f.config})
		if err != nil || !slices.Contains(pool, dev.ID) {
			t.Fatalf("create after restart: %+v %v (pool %v)", dev, err, pool)
		}
	}
	waitPool(t, h2.c, 2)
}

// waitPool polls until n pool devices exist (no timing assertion: the test
// deadline is the only bound).
func waitPool(t *testing.T, c *client.Client, n int) []uint32 {
	t.Helper()
	for {
		devs, err := c.List(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		var ids []uint32
		for _, d := range devs {
			if d.Kind == rpc.KindPool {
				ids = append(ids, d.ID)
			}
		}
		if len(ids) == n {
			return ids
		}
		if len(ids) > n {
			t.Fatalf("pool grew past its high watermark: %v", ids)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestHostileRPC: garbage on the RPC socket drops that connection only.
func TestHostileRPC(t *testing.T) {
	t.Parallel()
	h := start(t, testOptions(t))
	cases := [][]byte{
		{0xff, 0xff, 0xff, 0xff},
		append([]byte{0, 0, 0, 5}, "nope!"...),
		append([]byte{0, 0, 0, 40}, `{"id":1,"method":"create","params":[1]}`...),
	}
	for _, in := range cases {
		conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: h.opts.Socket, Net: "unix"})
		if err != nil {
			t.Fatal(err)
		}
		conn.Write(in)
		conn.CloseWrite()
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		reply, _ := io.ReadAll(conn)
		conn.Close()
		var resp rpc.Response
		if len(reply) > 4 {
			json.Unmarshal(reply[4:], &resp)
		}
		if len(reply) > 0 && (resp.Error == nil || resp.Error.Code != rpc.CodeInvalid) {
			t.Fatalf("input %q: reply %q", in, reply)
		}
	}
	if _, err := h.c.Features(ctxT(t)); err != nil {
		t.Fatalf("daemon unusable after hostile clients: %v", err)
	}
}

// TestKernelAttach attaches a device to /dev/nbdN where the kernel has the
// nbd module (the kernel lane), and refuses cleanly where it does not.
func TestKernelAttach(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 13)
	h := start(t, testOptions(t))
	ctx := ctxT(t)
	feats, err := h.c.Features(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := h.c.Create(ctx, rpc.CreateParams{Image: f.config, Kernel: true})
	if why := nbd.KernelAvailable(); why != nil {
		if feats.KernelNBD || !isCode(err, rpc.CodeInvalid) {
			t.Fatalf("without kernel nbd: features %+v, create err %v", feats, err)
		}
		t.Skipf("kernel NBD unavailable: %v", why)
	}
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4096)
	kf, err := os.Open(dev.BlockDevice)
	if err != nil {
		t.Fatal(err)
	}
	defer kf.Close()
	if _, err := kf.ReadAt(got, 0); err != nil || !bytes.Equal(got, f.want[:4096]) {
		t.Fatalf("read through %s: %v", dev.BlockDevice, err)
	}
	if err := h.c.Delete(ctx, dev.ID); err != nil {
		t.Fatal(err)
	}
}

// TestRestartAfterRestack: a restacked device comes back on its newest
// generation with the writes from before and after the restack; the old
// generation's files are gone.
func TestRestartAfterRestack(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 14)
	opts := testOptions(t)
	h := start(t, opts)
	ctx := ctxT(t)
	dev, err := h.c.Create(ctx, rpc.CreateParams{Image: f.config})
	if err != nil {
		t.Fatal(err)
	}
	nc := dialDev(t, dev)
	nc.WriteAt([]byte("before"), 0)
	res, err := h.c.Restack(ctx, rpc.RestackParams{ID: dev.ID})
	if err != nil {
		t.Fatal(err)
	}
	nc.WriteAt([]byte("after!"), 4096)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	h.stop()
	for _, old := range []string{"image.0.json", "upper.0.data", "upper.0.index"} {
		if _, err := os.Stat(filepath.Join(opts.StateDir, "devices", "0", old)); !os.IsNotExist(err) {
			t.Errorf("old generation file %s still there: %v", old, err)
		}
	}
	h2 := start(t, opts)
	devs, err := h2.c.List(ctx)
	if err != nil || len(devs) != 1 || devs[0].State != rpc.StateActive || !slices.Contains(devs[0].Layers, res.Layer) {
		t.Fatalf("after restart: %+v %v", devs, err)
	}
	nc2 := dialDev(t, devs[0])
	got := make([]byte, 4102)
	if _, err := nc2.ReadAt(got, 0); err != nil || string(got[:6]) != "before" || string(got[4096:]) != "after!" {
		t.Fatalf("after restart: %q %q %v", got[:6], got[4096:], err)
	}
}

// TestConcurrentClients: several clients create, delete, acquire and
// release at once; afterwards exactly one shared device holds every
// remaining holder and no runtime device is left.
func TestConcurrentClients(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 15)
	h := start(t, testOptions(t))
	ctx := ctxT(t)
	var wg sync.WaitGroup
	sharedIDs := make([]uint32, 6)
	for g := range 6 {
		wg.Go(func() {
			c, err := client.Dial(ctx, h.opts.Socket)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			holder := fmt.Sprintf("vm-%d", g)
			sh, err := c.AcquireShared(ctx, f.config, holder)
			if err != nil {
				t.Error(err)
				return
			}
			sharedIDs[g] = sh.ID
			for range 3 {
				dev, err := c.Create(ctx, rpc.CreateParams{Image: f.config, Owner: holder})
				if err != nil {
					t.Error(err)
					return
				}
				if err := c.Delete(ctx, dev.ID); err != nil {
					t.Error(err)
					return
				}
			}
			if g%2 == 0 {
				if err := c.ReleaseShared(ctx, sh.ID, holder); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	for _, id := range sharedIDs[1:] {
		if id != sharedIDs[0] {
			t.Fatalf("one image got several shared devices: %v", sharedIDs)
		}
	}
	devs, err := h.c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 1 || devs[0].Kind != rpc.KindShared {
		t.Fatalf("devices left: %+v", devs)
	}
	holders := slices.Sorted(slices.Values(devs[0].Holders))
	if !slices.Equal(holders, []string{"vm-1", "vm-3", "vm-5"}) {
		t.Fatalf("holders %v", holders)
	}
}

// repoint rewrites an image config in place to name other's base layer, as
// a template rebuild at the same path would.
func repoint(t *testing.T, f, other *fixture) {
	t.Helper()
	time.Sleep(10 * time.Millisecond) // a distinct mtime even on coarse clocks
	if err := (&image.Config{Lowers: []image.LayerRef{{File: other.base}}}).Save(f.config); err != nil {
		t.Fatal(err)
	}
}

// TestStaleSharedAndPool: after an image config changes, acquire gives new
// holders a fresh shared export (old holders keep theirs) and create never
// hands out a pool device made from the old layers.
func TestStaleSharedAndPool(t *testing.T) {
	t.Parallel()
	f, other := newFixture(t, 16), newFixture(t, 17)
	h := start(t, testOptions(t))
	ctx := ctxT(t)
	old, err := h.c.AcquireShared(ctx, f.config, "old-vm")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.c.Warm(ctx, rpc.WarmParams{Image: f.config, Low: 1, High: 1}); err != nil {
		t.Fatal(err)
	}
	pool := waitPool(t, h.c, 1)
	repoint(t, f, other)

	fresh, err := h.c.AcquireShared(ctx, f.config, "new-vm")
	if err != nil {
		t.Fatal(err)
	}
	if fresh.ID == old.ID {
		t.Fatal("a changed image reused the old shared export")
	}
	if got := readAll(t, dialDev(t, fresh), diskSize); !bytes.Equal(got, other.want) {
		t.Fatal("fresh shared export does not serve the new image")
	}
	if got := readAll(t, dialDev(t, old), diskSize); !bytes.Equal(got, f.want) {
		t.Fatal("old holders lost their export")
	}
	if err := h.c.ReleaseShared(ctx, old.ID, "old-vm"); err != nil {
		t.Fatal(err)
	}
	again, err := h.c.AcquireShared(ctx, f.config, "third-vm")
	if err != nil || again.ID != fresh.ID {
		t.Fatalf("acquire after the change settled: %+v %v (want device %d)", again, err, fresh.ID)
	}

	dev, err := h.c.Create(ctx, rpc.CreateParams{Image: f.config})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(pool, dev.ID) && dev.Layers[0] != other.base {
		t.Fatalf("create handed out the stale pool device %d", dev.ID)
	}
	if got := readAll(t, dialDev(t, dev), diskSize); !bytes.Equal(got, other.want) {
		t.Fatal("created device does not serve the new image")
	}
}
