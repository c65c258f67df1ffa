package disk

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/agentenv/agentenv/storage/blob"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
)

// TestLocalCopies: a device's URL lowers pair with the files a lazy job
// fetched into its image config's directory (<dir>/<hex>), and only those:
// a URL whose file is not there yet, a URL that names no digest, a local
// lower and a shared device's lowers stay as they are.
func TestLocalCopies(t *testing.T) {
	dir := t.TempDir()
	const hexA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	const hexB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	if err := os.WriteFile(filepath.Join(dir, hexA), []byte("layer"), 0o600); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "layers.sock")
	urlA := blob.UnixURL(sock, "/v1/lazy/sha256/"+hexA+"?size=5")
	urlB := blob.UnixURL(sock, "/v1/lazy/sha256/"+hexB+"?size=5")
	plain := "http://registry.example/v2/x/blobs/plain"
	dev := rpc.Device{ID: 3, Kind: rpc.KindRuntime, State: rpc.StateActive, Image: filepath.Join(dir, "rootfs.json"),
		Layers: []string{urlA, urlB, plain, filepath.Join(dir, "own.lsmt")}}
	got := localCopies(dev)
	want := []rpc.LocalLower{{URL: urlA, File: filepath.Join(dir, hexA)}}
	if !slices.Equal(got, want) {
		t.Fatalf("localCopies = %+v, want %+v", got, want)
	}
	dev.Kind = rpc.KindShared
	if got := localCopies(dev); len(got) != 0 {
		t.Fatalf("a shared device: %+v", got)
	}
	dev.Kind, dev.State = rpc.KindRuntime, rpc.StateLost
	if got := localCopies(dev); len(got) != 0 {
		t.Fatalf("a lost device: %+v", got)
	}
}
