package daemon

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
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
