package daemon

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentenv/agentenv/storage/daemon/rpc"
)

// FuzzRPCConn feeds arbitrary bytes to the daemon's RPC connection handler
// (framing, JSON, every method's parameters) on a daemon with one real
// device, and checks the daemon still answers and still has the device.
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
	f.Add(frame(rpc.MethodAcquireShared, `{"image":"","holder":"x"}`))
	f.Add(frame(rpc.MethodReleaseShared, `{"id":7,"holder":"x"}`))
	f.Add(frame(rpc.MethodReclaim, `{"owner":"","keep":[1,2]}`))
	f.Add(frame(rpc.MethodWarm, `{"image":"x","low":-1}`))
	f.Add(binary.BigEndian.AppendUint32(nil, 1<<31))

	fx := newFixture(f, 99)
	opts := Options{
		Socket: filepath.Join(f.TempDir(), "s.sock"), StateDir: filepath.Join(f.TempDir(), "state"),
		RunDir: filepath.Join(f.TempDir(), "run"), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
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
		// Keep the fixture device: deleting or restacking it is legitimate
		// but would make later inputs meaningless.
		if bytes.Contains(in, []byte(rpc.MethodShutdown)) || bytes.Contains(in, []byte(rpc.MethodDelete)) ||
			bytes.Contains(in, []byte(rpc.MethodRestack)) || bytes.Contains(in, []byte(rpc.MethodReclaim)) {
			return
		}
		client, server := net.Pipe()
		done := make(chan struct{})
		go func() { d.serveRPC(ctx, server); close(done) }()
		go func() { client.Write(in); client.Close() }()
		io.Copy(io.Discard, client)
		<-done
		if _, err := d.lookup(dev.ID); err != nil {
			t.Fatalf("fixture device gone: %v", err)
		}
		if _, err := d.dispatch(ctx, rpc.Request{Method: rpc.MethodFeatures}); err != nil {
			t.Fatalf("daemon stopped answering: %v", err)
		}
	})
}
