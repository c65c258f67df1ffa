package oci

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/agentenv/agentenv/internal/ctxio"
	"github.com/google/go-containerregistry/pkg/name"
)

// ArchiveImage is one image of a Docker archive and the tag `docker load`
// gives it.
type ArchiveImage struct {
	Tag   string // from LoadTag
	Image *Image
}

// LoadTag is the tag under which a loaded image answers the reference ref
// as a Compose file writes it, so that Compose finds it without a pull:
// the reference with ":latest" when it has none. A digest reference has
// no such tag (Docker matches it against the digest a registry gave, which
// a loaded image lacks), so it is refused.
func LoadTag(ref string) (string, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return "", fmt.Errorf("oci: load tag of %q: %w: %w", ref, ErrRefused, err)
	}
	t, ok := r.(name.Tag)
	if !ok {
		return "", fmt.Errorf("oci: load tag of %q: %w: a digest reference cannot be loaded under a tag Docker would resolve it by", ref, ErrRefused)
	}
	if t.TagStr() == "latest" && !hasTag(ref) {
		return ref + ":latest", nil
	}
	return ref, nil
}

// hasTag reports whether ref's last path element names a tag.
func hasTag(ref string) bool {
	for i := len(ref) - 1; i >= 0 && ref[i] != '/'; i-- {
		if ref[i] == ':' {
			return true
		}
	}
	return false
}

// archiveManifest is one entry of a Docker archive's manifest.json.
type archiveManifest struct {
	Config   string
	RepoTags []string
	Layers   []string
}

// WriteDockerArchive writes images as one archive `docker load` reads
// (the layout of `docker save`): each distinct config as <id>.json, each
// distinct layer uncompressed as <diff id>/layer.tar (its content checked
// against the diff ID while written), manifest.json last. Uncompressed
// layers load with any Docker Engine, whatever compression the registry
// served.
func WriteDockerArchive(ctx context.Context, w io.Writer, imgs []ArchiveImage) error {
	if len(imgs) == 0 {
		return errors.New("oci: docker archive: no images")
	}
	tw := tar.NewWriter(w)
	written := map[string]bool{}
	var manifest []archiveManifest
	for _, ai := range imgs {
		if ai.Image == nil || len(ai.Image.RawConfig) == 0 {
			return fmt.Errorf("oci: docker archive: image %s has no config", ai.Tag)
		}
		sum := sha256.Sum256(ai.Image.RawConfig)
		m := archiveManifest{Config: hex.EncodeToString(sum[:]) + ".json", RepoTags: []string{ai.Tag}}
		if !written[m.Config] {
			if err := writeEntry(tw, m.Config, ai.Image.RawConfig); err != nil {
				return fmt.Errorf("oci: docker archive: config of %s: %w", ai.Tag, err)
			}
			written[m.Config] = true
		}
		for _, l := range ai.Image.Layers {
			p := l.DiffID.Hex + "/layer.tar"
			m.Layers = append(m.Layers, p)
			if written[p] {
				continue
			}
			if err := writeLayer(ctx, tw, p, l); err != nil {
				return fmt.Errorf("oci: docker archive: layer %s of %s: %w", l.Digest, ai.Tag, err)
			}
			written[p] = true
		}
		manifest = append(manifest, m)
	}
	b, err := json.Marshal(manifest)
	if err != nil {
		return fmt.Errorf("oci: docker archive: manifest: %w", err)
	}
	if err := writeEntry(tw, "manifest.json", b); err != nil {
		return fmt.Errorf("oci: docker archive: manifest: %w", err)
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("oci: docker archive: %w", err)
	}
	return nil
}

// archiveTime is every entry's time: the archive of the same images is
// the same bytes.
var archiveTime = time.Unix(0, 0)

func writeEntry(tw *tar.Writer, path string, data []byte) error {
	if err := tw.WriteHeader(&tar.Header{Name: path, Mode: 0o644, Size: int64(len(data)), ModTime: archiveTime, Format: tar.FormatPAX}); err != nil {
		return err
	}
	_, err := tw.Write(data)
	return err
}

// writeLayer writes a layer uncompressed. A tar entry needs its size
// first, so the layer is decompressed twice: once to count (and check its
// diff ID before anything of it is written), once to write.
func writeLayer(ctx context.Context, tw *tar.Writer, path string, l Layer) error {
	size, err := copyLayer(ctx, io.Discard, l)
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: path, Mode: 0o644, Size: size, ModTime: archiveTime, Format: tar.FormatPAX}); err != nil {
		return err
	}
	n, err := copyLayer(ctx, tw, l)
	if err == nil && n != size {
		err = fmt.Errorf("changed while written: %d bytes, then %d", size, n)
	}
	return err
}

func copyLayer(ctx context.Context, w io.Writer, l Layer) (int64, error) {
	rc, err := l.Open()
	if err != nil {
		return 0, err
	}
	n, err := io.Copy(w, ctxio.Reader(ctx, rc))
	if cerr := rc.Close(); err == nil {
		err = cerr
	}
	return n, err
}

// PullArchive pulls every reference through the node's registry
// configuration (default, allowed and insecure registries, credentials)
// and writes them as one Docker archive, each under its LoadTag: what a
// guest loads to run images it cannot pull itself.
func (p *Puller) PullArchive(ctx context.Context, w io.Writer, refs []string) error {
	imgs := make([]ArchiveImage, 0, len(refs))
	for _, ref := range refs {
		tag, err := LoadTag(ref)
		if err != nil {
			return err
		}
		img, err := p.Pull(ctx, ref)
		if err != nil {
			return err
		}
		imgs = append(imgs, ArchiveImage{Tag: tag, Image: img})
	}
	return WriteDockerArchive(ctx, w, imgs)
}
