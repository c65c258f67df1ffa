package disk

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/snapshot"
	"github.com/agentenv/agentenv/storage/blob"
	"github.com/agentenv/agentenv/storage/daemon/rpc"
)

// listedDevices answers List with fixed devices (the daemon's side of Local
// is only its device list; api/e2e.TestLazyResumeOverS3 runs it for real).
type listedDevices struct{ devs []rpc.Device }

func (l listedDevices) Acquire(context.Context, rpc.AcquireParams) (rpc.Device, error) {
	return rpc.Device{}, rpc.ErrNotFound
}
func (l listedDevices) ReleaseShared(context.Context, uint32, string) error { return nil }
func (l listedDevices) List(context.Context) ([]rpc.Device, error)          { return l.devs, nil }
func (l listedDevices) Prefetch(context.Context, rpc.PrefetchParams) (rpc.PrefetchResult, error) {
	return rpc.PrefetchResult{}, rpc.ErrNotFound
}

// TestLocalMemory: a memory image whose layers a repository import left
// remote is named by the local copies its stack's config lists (linked
// into the capturing sandbox's directory, the same inode); a stack whose
// config still names the URL, or an export no device has, is an error,
// never a wrong name.
func TestLocalMemory(t *testing.T) {
	snapDir, own := t.TempDir(), t.TempDir()
	const hexA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	urlA := blob.UnixURL(filepath.Join(snapDir, "layers.sock"), "/v1/lazy/sha256/"+hexA+"?size=5")
	copyA := filepath.Join(snapDir, hexA)
	if err := os.WriteFile(copyA, []byte("layer"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(t.TempDir(), "mem-0.lsmt")
	cfg := filepath.Join(snapDir, stackConfig)
	if err := snapshot.WriteImageConfig(cfg, []string{base, copyA}); err != nil {
		t.Fatal(err)
	}
	if !listsLayers(cfg, []string{base, urlA}) || listsLayers(cfg, []string{base, base}) {
		t.Fatal("listsLayers: a local copy must stand for its URL, and only for it")
	}
	export := "/run/aenv-storaged/mem/aenv-7-n"
	d := &MemoryDevices{log: slog.Default(), lazy: newLazyRootfs(nil, nil, nil, nil),
		sd: listedDevices{devs: []rpc.Device{{ID: 7, Kind: rpc.KindShared, Image: cfg, BlockDevice: export}}}}
	m := snapshot.MemoryImage{Layers: []string{base, urlA}, File: export}
	got, err := d.Local(t.Context(), m, own)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{base, filepath.Join(own, hexA)}; !slices.Equal(got.Layers, want) || got.File != export {
		t.Fatalf("Local = %+v, want layers %v on %s", got, want, export)
	}
	a, _ := os.Stat(copyA)
	b, err := os.Stat(got.Layers[1])
	if err != nil || !os.SameFile(a, b) {
		t.Fatalf("the layer in the sandbox's directory is not the fetched copy: %v", err)
	}
	if again, err := d.Local(t.Context(), m, own); err != nil || !slices.Equal(again.Layers, got.Layers) {
		t.Fatalf("Local again: %+v, %v", again, err)
	}
	if plain, err := d.Local(t.Context(), snapshot.MemoryImage{Layers: []string{base}, File: "/nowhere"}, own); err != nil || plain.Layers[0] != base {
		t.Fatalf("an image of local layers: %+v, %v", plain, err)
	}

	if _, err := d.Local(t.Context(), snapshot.MemoryImage{Layers: m.Layers, File: "/run/aenv-storaged/mem/aenv-8-n"}, own); err == nil ||
		!strings.Contains(err.Error(), "no memory device") {
		t.Fatalf("an export no device has: %v", err)
	}
	if err := snapshot.WriteImageConfig(cfg, []string{base, urlA}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Local(t.Context(), m, own); err == nil || !strings.Contains(err.Error(), "local copy") {
		t.Fatalf("a stack still naming the URL: %v", err)
	}
}
