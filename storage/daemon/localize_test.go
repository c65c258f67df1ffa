package daemon

import (
	"bytes"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentenv/agentenv/storage/blob"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
	"github.com/agentenv/agentenv/storage/image"
)

// layerServer serves a fixture's base layer over HTTP on a Unix socket, as
// a node serves the layers it has not fetched yet to its daemon.
type layerServer struct {
	url    string // http+unix URL naming the layer's digest
	config string // image config with the URL as its one lower
	srv    *http.Server
	reads  atomic.Int64
}

// serveBase starts a layerServer for f; stop ends it (the socket then
// refuses every read).
func (f *fixture) serveBase(t testing.TB) *layerServer {
	t.Helper()
	data, err := os.ReadFile(f.base)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := hashFile(t.Context(), f.base)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(f.dir, "layers.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ls := &layerServer{url: blob.UnixURL(sock, "/v1/lazy/sha256/"+strings.TrimPrefix(sum, "sha256:")),
		config: filepath.Join(f.dir, "remote.json")}
	ls.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ls.reads.Add(1)
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
	})}
	go ls.srv.Serve(ln)
	t.Cleanup(ls.stop)
	if err := (&image.Config{Lowers: []image.LayerRef{{URL: ls.url}}}).Save(ls.config); err != nil {
		t.Fatal(err)
	}
	return ls
}

func (ls *layerServer) stop() { ls.srv.Close() }

// TestLocalize: a device whose lower is a URL, written to, moves onto a
// local copy of the layer under its live export: a copy with other bytes
// is refused and changes nothing; the right one is taken, the guest's
// writes and the layer read the same, the URL is read no more, and a
// restarted daemon serves the device from the file with the server gone.
func TestLocalize(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 41)
	ls := f.serveBase(t)
	opts := testOptions(t)
	h := start(t, opts)
	ctx := ctxT(t)
	dev, err := h.c.Create(ctx, rpc.CreateParams{Image: ls.config, Owner: "x"})
	if err != nil {
		t.Fatal(err)
	}
	if len(dev.Layers) != 1 || dev.Layers[0] != ls.url {
		t.Fatalf("layers %v", dev.Layers)
	}
	want := bytes.Clone(f.want)
	nc := dialDev(t, dev)
	if _, err := nc.WriteAtFUA([]byte("written over the remote layer"), 300000); err != nil {
		t.Fatal(err)
	}
	copy(want[300000:], "written over the remote layer")
	if got := readAll(t, nc, diskSize); !bytes.Equal(got, want) {
		t.Fatal("device over the URL reads other bytes")
	}

	other := newFixture(t, 42) // a layer, but not this one
	_, err = h.c.Localize(ctx, rpc.LocalizeParams{ID: dev.ID, Lowers: []rpc.LocalLower{{URL: ls.url, File: other.base}}})
	if !isCode(err, rpc.CodeInvalid) || !strings.Contains(err.Error(), "not the layer's") {
		t.Fatalf("a copy with other bytes: %v", err)
	}
	if devs, _ := h.c.List(ctx); devs[0].Layers[0] != ls.url || devs[0].Config != dev.Config {
		t.Fatalf("a refused localize changed the device: %+v", devs[0])
	}

	moved, err := h.c.Localize(ctx, rpc.LocalizeParams{ID: dev.ID, Lowers: []rpc.LocalLower{{URL: ls.url, File: f.base}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(moved.Layers) != 1 || moved.Layers[0] != f.base || moved.Config == dev.Config {
		t.Fatalf("after localize: layers %v config %s", moved.Layers, moved.Config)
	}
	if _, err := os.Stat(dev.Config); !os.IsNotExist(err) {
		t.Fatalf("the old config is left: %v", err)
	}
	ls.stop()
	before := ls.reads.Load()
	if got := readAll(t, nc, diskSize); !bytes.Equal(got, want) {
		t.Fatal("device after localize reads other bytes")
	}
	if n := ls.reads.Load(); n != before {
		t.Fatalf("the URL was read %d times after the move", n-before)
	}
	again, err := h.c.Localize(ctx, rpc.LocalizeParams{ID: dev.ID, Lowers: []rpc.LocalLower{{URL: ls.url, File: f.base}}})
	if err != nil || again.Config != moved.Config {
		t.Fatalf("a retried localize: %v (config %s)", err, again.Config)
	}

	h.stop()
	h = start(t, opts)
	devs, err := h.c.List(ctxT(t))
	if err != nil || len(devs) != 1 || devs[0].State != rpc.StateActive {
		t.Fatalf("after a restart without the server: %+v %v", devs, err)
	}
	if got := readAll(t, dialDev(t, devs[0]), diskSize); !bytes.Equal(got, want) {
		t.Fatal("restarted device reads other bytes")
	}
	res, err := h.c.Restack(ctxT(t), rpc.RestackParams{ID: dev.ID})
	if err != nil {
		t.Fatal(err)
	}
	// The restack takes the localized config away with its generation.
	entries, _ := os.ReadDir(filepath.Dir(res.Device.Config))
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "image.") && filepath.Join(filepath.Dir(res.Device.Config), e.Name()) != res.Device.Config {
			t.Errorf("config %s left after the restack", e.Name())
		}
	}
}

// TestRestartReadsRemote: a restarted daemon re-exports a device whose
// lower is still a URL, reading it again from the server.
func TestRestartReadsRemote(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 43)
	ls := f.serveBase(t)
	opts := testOptions(t)
	h := start(t, opts)
	dev, err := h.c.Create(ctxT(t), rpc.CreateParams{Image: ls.config})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dialDev(t, dev).WriteAtFUA([]byte("kept"), 7<<20); err != nil {
		t.Fatal(err)
	}
	h.stop()
	h = start(t, opts)
	devs, err := h.c.List(ctxT(t))
	if err != nil || len(devs) != 1 || devs[0].State != rpc.StateActive || devs[0].Layers[0] != ls.url {
		t.Fatalf("after a restart: %+v %v", devs, err)
	}
	want := bytes.Clone(f.want)
	copy(want[7<<20:], "kept")
	if got := readAll(t, dialDev(t, devs[0]), diskSize); !bytes.Equal(got, want) {
		t.Fatal("restarted device reads other bytes")
	}
}
