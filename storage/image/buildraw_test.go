package image

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentenv/agentenv/storage/lsmt"
	"github.com/agentenv/agentenv/storage/zfile"
)

// writeDisk returns a BuildRaw writer that puts disk (holes where it is
// zero, as a formatting tool leaves them) into the file from off on.
func writeDisk(disk []byte) func(context.Context, string, int64) error {
	return func(_ context.Context, path string, off int64) error {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		for i := 0; i < len(disk); i += 4096 {
			b := disk[i:min(i+4096, len(disk))]
			if bytes.Count(b, []byte{0}) == len(b) {
				continue
			}
			if _, err := f.WriteAt(b, off+int64(i)); err != nil {
				return err
			}
		}
		return f.Sync()
	}
}

// TestBuildRaw: a disk written into the layer file (in place) or into a
// temporary raw file (compressed) reads back byte for byte, holes and a
// trailing hole included, and leaves no temporary file behind.
func TestBuildRaw(t *testing.T) {
	ctx := context.Background()
	disk := make([]byte, 9<<20+512)
	copy(disk[4096:], fill(1, 3<<20))
	copy(disk[6<<20:], fill(2, 8192))
	copy(disk[8<<20+100:], "a few bytes")
	for _, comp := range []*zfile.Options{nil, {BlockSize: 16384}} {
		dir := t.TempDir()
		out := filepath.Join(dir, "disk.lsmt")
		info, err := BuildRaw(ctx, out, int64(len(disk)), CommitOptions{Message: "test", Compress: comp}, writeDisk(disk))
		if err != nil {
			t.Fatalf("BuildRaw (compress %v): %v", comp != nil, err)
		}
		if info.Path != out || info.Segments == 0 {
			t.Errorf("BuildRaw (compress %v): info %+v", comp != nil, info)
		}
		im, err := OpenLayers(ctx, []string{out}, Options{})
		if err != nil {
			t.Fatalf("open the built layer (compress %v): %v", comp != nil, err)
		}
		if im.Size() != int64(len(disk)) {
			t.Errorf("compress %v: size %d, want %d", comp != nil, im.Size(), len(disk))
		}
		if got := readAll(t, im); !bytes.Equal(got, disk) {
			t.Errorf("compress %v: the layer does not read back as the disk written", comp != nil)
		}
		im.Close()
		ents, _ := os.ReadDir(dir)
		if len(ents) != 1 {
			t.Errorf("compress %v: %d files left in the directory, want the layer only", comp != nil, len(ents))
		}
	}
}

// TestBuildRawRejectsOversizedDisk: a writer that writes past the size it
// announced fails the build, and no layer is left at out.
func TestBuildRawRejectsOversizedDisk(t *testing.T) {
	ctx := context.Background()
	disk := fill(3, 1<<20)
	for _, comp := range []*zfile.Options{nil, {}} {
		out := filepath.Join(t.TempDir(), "disk.lsmt")
		_, err := BuildRaw(ctx, out, int64(len(disk))-lsmt.SectorSize, CommitOptions{Compress: comp}, writeDisk(disk))
		if err == nil || !strings.Contains(err.Error(), "larger than") {
			t.Errorf("compress %v: BuildRaw of an oversized disk: %v, want larger than", comp != nil, err)
		}
		if _, err := os.Stat(out); !os.IsNotExist(err) {
			t.Errorf("compress %v: a layer was left at %s (%v)", comp != nil, out, err)
		}
	}
}
