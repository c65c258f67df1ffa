package daemon

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/storage/daemon/rpc"
)

// destructive methods change or end the daemon's devices: inputs naming
// them run on a scratch daemon of their own.
var destructive = []string{rpc.MethodDelete, rpc.MethodRestack, rpc.MethodRebase, rpc.MethodReclaim, rpc.MethodShutdown}

// FuzzRPCConn feeds arbitrary bytes to the daemon's RPC connection handler
// (framing, JSON, every method's parameters). Inputs that cannot remove
// anything run on one long-lived daemon with a real device, which must
// still answer and still have the device. Inputs naming delete, restack,
// rebase, reclaim or shutdown run on a fresh state directory with one device; after
// them a restarted daemon must find exactly the devices the first one had
// at the end, none lost.
func FuzzRPCConn(f *testing.F) {
	frame := func(method, params string) []byte {
		var b bytes.Buffer
		rpc.WriteFrame(&b, rpc.Request{ID: 1, Method: method, Params: []byte(params)})
		return b.Bytes()
	}
	f.Add(frame(rpc.MethodList, ""))
	f.Add(frame(rpc.MethodCreate, `{"image":"/nonexistent/image.json","size":512}`))
	f.Add(frame(rpc.MethodDelete, `{"id":0}`))
	f.Add(frame(rpc.MethodRestack, `{"id":0,"layer":""}`))
	f.Add(append(frame(rpc.MethodRestack, `{"id":0}`), frame(rpc.MethodDelete, `{"id":0}`)...))
	f.Add(frame(rpc.MethodAcquireShared, `{"image":"","holder":"x"}`))
	f.Add(frame(rpc.MethodReleaseShared, `{"id":7,"holder":"x"}`))
	f.Add(frame(rpc.MethodReclaim, `{"owner":"fuzz","keep":[1,2]}`))
	f.Add(frame(rpc.MethodReclaim, `{"owner":"","keep":[1,2]}`))
	f.Add(frame(rpc.MethodShutdown, ``))
	f.Add(frame(rpc.MethodWarm, `{"image":"x","low":-1}`))
	f.Add(frame(rpc.MethodRebase, `{"id":0,"image":"/nonexistent/image.json"}`))
	f.Add(frame(rpc.MethodRebase, `{"id":0,"image":""}`))
	f.Add(binary.BigEndian.AppendUint32(nil, 1<<31))

	fx := newFixture(f, 99)
	f.Add(frame(rpc.MethodRebase, `{"id":0,"image":"`+fx.config+`"}`)) // a rebase that moves the device
	opts := fuzzOptions(f.TempDir())
	d, err := New(opts)
	if err != nil {
		f.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go d.Run(ctx)
	for d.ctxReady() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	dev, err := d.create(ctx, rpc.CreateParams{Image: fx.config})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if slices.ContainsFunc(destructive, func(m string) bool { return bytes.Contains(in, []byte(m)) }) {
			fuzzScratch(t, fx, in)
			return
		}
		serveBytes(ctx, d, in)
		if _, err := d.lookup(dev.ID); err != nil {
			t.Fatalf("fixture device gone: %v", err)
		}
		if _, err := d.dispatch(ctx, rpc.Request{Method: rpc.MethodFeatures}); err != nil {
			t.Fatalf("daemon stopped answering: %v", err)
		}
	})
}

func fuzzOptions(dir string) Options {
	return Options{
		Socket: filepath.Join(dir, "s.sock"), StateDir: filepath.Join(dir, "state"),
		RunDir: filepath.Join(dir, "run"), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
}

// serveBytes runs one connection carrying in and waits for every answer.
func serveBytes(ctx context.Context, d *Daemon, in []byte) {
	client, server := net.Pipe()
	done := make(chan struct{})
	go func() { d.serveRPC(ctx, server); close(done) }()
	go func() { client.Write(in); client.Close() }()
	io.Copy(io.Discard, client)
	<-done
}

// fuzzScratch runs in on a daemon of its own and checks a restart agrees.
func fuzzScratch(t *testing.T, fx *fixture, in []byte) {
	dir := t.TempDir()
	if !layersUnder(in, dir) {
		return // would write a layer wherever the input says
	}
	opts := fuzzOptions(dir)
	opts.Socket = ""
	d, ctx, stop := openScratch(t, opts)
	if _, err := d.create(ctx, rpc.CreateParams{Image: fx.config, Owner: "fuzz"}); err != nil {
		t.Fatal(err)
	}
	serveBytes(ctx, d, in)
	before := d.list().Devices
	stop()
	d2, _, stop2 := openScratch(t, opts)
	defer stop2()
	after := d2.list().Devices
	if len(after) != len(before) {
		t.Fatalf("%d devices before the restart, %d after", len(before), len(after))
	}
	for i, dv := range after {
		if dv.ID != before[i].ID || dv.Kind != before[i].Kind || dv.State != rpc.StateActive || !slices.Equal(dv.Layers, before[i].Layers) {
			t.Fatalf("device after the restart %+v, before %+v", dv, before[i])
		}
	}
}

// openScratch opens a daemon without its RPC listener; stop ends it as Run would.
func openScratch(t *testing.T, opts Options) (*Daemon, context.Context, func()) {
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := d.open(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	return d, ctx, func() {
		cancel()
		d.bg.Wait()
		d.stopAll()
		d.lockFile.Close()
	}
}

// layersUnder says whether every restack request in in that names a layer
// path names one under dir (a fuzzed path elsewhere would write there).
func layersUnder(in []byte, dir string) bool {
	r := bytes.NewReader(in)
	for {
		var req rpc.Request
		if err := rpc.ReadFrame(r, &req); err != nil {
			return true // the server stops reading here too
		}
		if req.Method != rpc.MethodRestack {
			continue
		}
		var p rpc.RestackParams
		if json.Unmarshal(req.Params, &p) == nil && p.Layer != "" && !strings.HasPrefix(filepath.Clean(p.Layer), dir+"/") {
			return false
		}
	}
}
