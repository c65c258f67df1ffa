// Package oci benchmarks the conversion of OCI image layers into a bootable
// root filesystem stored as a sealed LSMT layer (oci.Puller.Convert: unpack,
// inject, mke2fs -d, import) against `tar -x` of the same layer blobs into a
// directory, measured in the same run and printed as a ratio (ours / tar).
// The layers are a Debian root filesystem (the tree the guest image builder
// caches) or, when none is cached, a synthetic tree of the same shape.
//
// It prints, in one run, the best MB/s of each and the medians over the
// rounds of convert and unpack against the tar -x of their own round, with
// the goal: "convert 0.72x tar -x (goal >= 0.5x)".
//
// Measured on the shared 2-core development host (Debian tree, 140 MB in two
// gzip layers, -benchtime 5x, two runs each): convert 0.71x and 0.72x tar -x
// after mke2fs wrote into the layer file itself; 0.61x and 0.83x before
// (mke2fs into a raw file, copied into the layer, two data syncs, the tree
// removed after). What the conversion adds to the unpack went from
// 1.3-2.0 s to 1.2-1.4 s for mke2fs and the layer (5 alternating rounds on
// one tree), and removing the tree now overlaps the sealing. The ratio is
// bound by the unpack: like tar -x it makes one host inode per entry, and a
// create on that host costs from tens of microseconds to a millisecond
// depending on how churned the block group is (ext4 without a journal passes
// over recently freed inodes), so both move together and a round takes from
// 2 to 11 s. Going well past 1x needs the ext4 builder to take the tar
// streams directly instead of a host tree.
package oci

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"

	guestimage "github.com/agentenv/agentenv/guest/image"
	aoci "github.com/agentenv/agentenv/oci"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/klauspost/compress/gzip"
)

// Fixture is an image whose layer blobs sit in a puller's cache.
type Fixture struct {
	Dir    string
	Puller *aoci.Puller
	Image  *aoci.Image
	Bytes  int64  // uncompressed layer bytes
	Source string // what the layers hold
}

// SourceTree returns the cached Debian tree, or builds a synthetic tree of
// about mib MiB under dir.
func SourceTree(dir string, mib int) (string, string, error) {
	trees, _ := filepath.Glob(filepath.Join(guestimage.DefaultCacheDir(), "rootfs", "*", "tree"))
	for _, t := range trees {
		if _, err := os.Stat(filepath.Join(t, "usr/bin/dpkg")); err == nil {
			return t, "debian tree " + t, nil
		}
	}
	tree := filepath.Join(dir, "synthetic")
	r := rand.New(rand.NewPCG(1, 2))
	var total int64
	for i := 0; total < int64(mib)<<20; i++ {
		d := filepath.Join(tree, "usr", fmt.Sprintf("d%03d", i/50))
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", "", err
		}
		size := 512 + r.IntN(64<<10)
		if i%40 == 0 {
			size = 1<<20 + r.IntN(2<<20)
		}
		b := make([]byte, size)
		for j := range b {
			if j%64 < 40 {
				b[j] = byte('a' + r.IntN(26))
			}
		}
		if err := os.WriteFile(filepath.Join(d, fmt.Sprintf("f%05d", i)), b, 0o644); err != nil {
			return "", "", err
		}
		total += int64(size)
	}
	return tree, fmt.Sprintf("synthetic tree of %d MiB", total>>20), nil
}

// NewFixture tars the source tree with GNU tar into two gzip layers (usr and
// the rest) and stores them as cached blobs of an image.
func NewFixture(ctx context.Context, dir string, mib int) (*Fixture, error) {
	tree, source, err := SourceTree(dir, mib)
	if err != nil {
		return nil, err
	}
	p, err := aoci.NewPuller(aoci.Options{CacheDir: filepath.Join(dir, "cache")})
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(tree)
	if err != nil {
		return nil, err
	}
	var rest []string
	for _, e := range ents {
		if e.Name() != "usr" {
			rest = append(rest, e.Name())
		}
	}
	f := &Fixture{Dir: dir, Puller: p, Source: source}
	img := &aoci.Image{Ref: "bench/rootfs:latest"}
	h := sha256.New()
	for _, paths := range [][]string{rest, {"usr"}} {
		if len(paths) == 0 {
			continue
		}
		args := append([]string{"--xattrs", "--xattrs-include=*", "--numeric-owner", "-C", tree, "-cf", "-"}, paths...)
		tarb, err := exec.CommandContext(ctx, "tar", args...).Output()
		if err != nil {
			return nil, fmt.Errorf("tar %v: %w", paths, err)
		}
		var gz bytes.Buffer
		w, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
		w.Write(tarb)
		w.Close()
		diff := sha256.Sum256(tarb)
		dg := sha256.Sum256(gz.Bytes())
		l := aoci.Layer{
			Digest: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(dg[:])},
			DiffID: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(diff[:])},
			Size:   int64(gz.Len()),
		}
		l.Path = p.BlobPath(l.Digest)
		if err := os.WriteFile(l.Path, gz.Bytes(), 0o644); err != nil {
			return nil, err
		}
		img.Layers = append(img.Layers, l)
		f.Bytes += int64(len(tarb))
		h.Write(dg[:])
	}
	img.Digest = v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}
	f.Image = img
	return f, nil
}

// TarExtract extracts the fixture's layer blobs in order with GNU tar into
// dir, as root (owners, modes, xattrs kept).
func (f *Fixture) TarExtract(ctx context.Context, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, l := range f.Image.Layers {
		out, err := exec.CommandContext(ctx, "tar", "--xattrs", "--xattrs-include=*", "--numeric-owner", "-xzf", l.Path, "-C", dir).CombinedOutput()
		if err != nil {
			return fmt.Errorf("tar -x %s: %w: %s", l.Path, err, out)
		}
	}
	return nil
}
