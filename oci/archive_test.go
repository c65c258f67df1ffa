package oci

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	lt "github.com/agentenv/agentenv/oci/internal/layertest"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestDockerArchiveOfPulledImages: two images pulled from a real registry
// server, sharing their base layer (gzip) and each with one of its own
// (one uncompressed), pulled and written as one Docker archive; go-containerregistry's
// reader of `docker save` archives finds each under its tag with the
// registry's config (same image ID) and layers whose content hashes to the
// config's diff IDs; the shared layer is in the archive once.
func TestDockerArchiveOfPulledImages(t *testing.T) {
	ctx := context.Background()
	reg := startRegistry(t, "", "")
	base := gzipLayer(t, lt.Tar([]lt.Entry{lt.Dir("etc", 0o755), lt.File("etc/os-release", "ID=test\n", 0o644)}))
	web := buildImage(t, "amd64", base, gzipLayer(t, lt.Tar([]lt.Entry{lt.File("srv/index.html", "hello from web\n", 0o644)})))
	client := buildImage(t, "amd64", base, rawLayer(lt.Tar([]lt.Entry{lt.File("bin/client", "#!/bin/sh\n", 0o755)})))
	reg.push(t, "bench/web:1", web)
	reg.push(t, "bench/client:latest", client)

	p, err := NewPuller(Options{CacheDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	refs := []string{reg.host + "/bench/web:1", reg.host + "/bench/client"}
	path := filepath.Join(t.TempDir(), "images.tar")
	var buf bytes.Buffer
	if err := p.PullArchive(ctx, &buf, refs); err != nil {
		t.Fatalf("PullArchive: %v", err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if n := countEntries(t, buf.Bytes(), "/layer.tar"); n != 3 {
		t.Errorf("archive holds %d layer files, want 3 (the shared base once)", n)
	}
	for i, want := range []v1.Image{web, client} {
		tag, err := name.NewTag([]string{refs[0], refs[1] + ":latest"}[i])
		if err != nil {
			t.Fatal(err)
		}
		got, err := tarball.ImageFromPath(path, &tag)
		if err != nil {
			t.Fatalf("read %s from the archive: %v", tag, err)
		}
		checkSameImage(t, tag.String(), got, want)
	}
}

func checkSameImage(t *testing.T, tag string, got, want v1.Image) {
	t.Helper()
	gotID, err := got.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	wantID, _ := want.ConfigName()
	if gotID != wantID {
		t.Errorf("%s: image ID %s, want the registry's %s", tag, gotID, wantID)
	}
	cfg, _ := want.ConfigFile()
	layers, err := got.Layers()
	if err != nil || len(layers) != len(cfg.RootFS.DiffIDs) {
		t.Fatalf("%s: %d layers (%v), want %d", tag, len(layers), err, len(cfg.RootFS.DiffIDs))
	}
	for i, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		_, err = io.Copy(h, rc)
		rc.Close()
		if err != nil || "sha256:"+hex.EncodeToString(h.Sum(nil)) != cfg.RootFS.DiffIDs[i].String() {
			t.Errorf("%s: layer %d hashes to %x (%v), want %s", tag, i, h.Sum(nil), err, cfg.RootFS.DiffIDs[i])
		}
	}
}

func countEntries(t *testing.T, archive []byte, suffix string) int {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(archive))
	n := 0
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return n
		}
		if err != nil {
			t.Fatalf("read archive: %v", err)
		}
		if strings.HasSuffix(h.Name, suffix) {
			n++
		}
	}
}

// TestDockerArchiveRefusesAlteredLayer: a cached blob whose content no
// longer matches its diff ID fails the write, naming the layer.
func TestDockerArchiveRefusesAlteredLayer(t *testing.T) {
	ctx := context.Background()
	reg := startRegistry(t, "", "")
	reg.push(t, "bench/x:1", buildImage(t, "amd64", rawLayer(lt.Tar([]lt.Entry{lt.File("a", "original", 0o644)}))))
	p, err := NewPuller(Options{CacheDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	img, err := p.Pull(ctx, reg.host+"/bench/x:1")
	if err != nil {
		t.Fatal(err)
	}
	blob, err := os.ReadFile(img.Layers[0].Path)
	if err != nil {
		t.Fatal(err)
	}
	altered := bytes.Replace(blob, []byte("original"), []byte("tampered"), 1)
	if err := os.WriteFile(img.Layers[0].Path, altered, 0o600); err != nil {
		t.Fatal(err)
	}
	err = WriteDockerArchive(ctx, io.Discard, []ArchiveImage{{Tag: reg.host + "/bench/x:1", Image: img}})
	t.Logf("refusal: %v", err)
	if err == nil || !strings.Contains(err.Error(), img.Layers[0].Digest.String()) {
		t.Fatalf("WriteDockerArchive of an altered layer: %v, want an error naming %s", err, img.Layers[0].Digest)
	}
}

func TestLoadTag(t *testing.T) {
	for ref, want := range map[string]string{
		"alpine":                                     "alpine:latest",
		"alpine:3.20":                                "alpine:3.20",
		"registry.example:5000/web":                  "registry.example:5000/web:latest",
		"registry.example:5000/web:1":                "registry.example:5000/web:1",
		"alpine@sha256:" + strings.Repeat("a", 64):   "",
		"alpine:3@sha256:" + strings.Repeat("a", 64): "",
		"NOT VALID":                                  "",
	} {
		got, err := LoadTag(ref)
		if got != want || (want == "") != (err != nil) || (err != nil && !errors.Is(err, ErrRefused)) {
			t.Errorf("LoadTag(%q) = %q, %v; want %q (an error being ErrRefused)", ref, got, err, want)
		}
	}
}
