package image

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentenv/agentenv/storage/blob"
)

// TestSwapLower: an image whose lower is read over a Unix socket, with an
// upper written on top, moves that lower onto a local copy while open; it
// reads the same bytes after, keeps its upper's writes, and no longer
// touches the socket.
func TestSwapLower(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	const size = 2 << 20
	base := fill(5, size)
	raw := filepath.Join(dir, "base.raw")
	if err := os.WriteFile(raw, base, 0o600); err != nil {
		t.Fatal(err)
	}
	layer := filepath.Join(dir, "base.lsmt")
	if _, err := ImportRaw(ctx, raw, layer, CommitOptions{}); err != nil {
		t.Fatal(err)
	}
	layerBytes, err := os.ReadFile(layer)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "l.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(layerBytes))
	})}
	go srv.Serve(ln)
	defer srv.Close()
	url := blob.UnixURL(sock, "/v1/lazy/sha256/x")
	cfgPath := filepath.Join(dir, "img.json")
	if _, err := Create(ctx, cfgPath, CreateSpec{Lowers: []string{url}}); err != nil {
		t.Fatal(err)
	}
	im, err := Open(ctx, cfgPath, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer im.Close()
	if got := im.RemoteLowers(); len(got) != 1 || got[0] != url {
		t.Fatalf("remote lowers %v", got)
	}
	want := bytes.Clone(base)
	if _, err := im.WriteAt([]byte("upper bytes"), 4096); err != nil {
		t.Fatal(err)
	}
	copy(want[4096:], "upper bytes")
	if got := readAll(t, im); !bytes.Equal(got, want) {
		t.Fatal("read through the socket differs")
	}
	short, err := blob.OpenLocal(raw, true) // not the layer: another size
	if err != nil {
		t.Fatal(err)
	}
	if n, err := im.SwapLower(url, short); err == nil || n != 0 {
		t.Fatalf("a copy of another size moved %d lowers (err %v)", n, err)
	}
	short.Close()
	local, err := blob.OpenLocal(layer, true)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := im.SwapLower(url, local); err != nil || n != 1 {
		t.Fatalf("swap: %d %v", n, err)
	}
	srv.Close() // from here on the socket answers nothing
	if got := im.RemoteLowers(); len(got) != 0 {
		t.Fatalf("remote lowers after the swap %v", got)
	}
	if got := readAll(t, im); !bytes.Equal(got, want) {
		t.Fatal("read from the local copy differs")
	}
}
