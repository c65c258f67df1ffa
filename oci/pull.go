// Package oci pulls OCI and Docker images from registries and converts them
// into bootable root filesystems stored as sealed LSMT layers.
//
// Pulling uses go-containerregistry's remote client: anonymous or keychain
// credentials with the registry token flow, plain-HTTP ("insecure")
// registries when configured, the linux/amd64 child of an index, manifests
// and blobs verified against their digests, and layer blobs cached by digest
// under the cache directory (shared by every image that uses them).
// Unpacking lives in oci/unpack, conversion in Convert (convert.go), and
// the Docker archives a compose sandbox's guest loads in archive.go.
package oci

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/agentenv/agentenv/internal/atomicfile"
	"github.com/agentenv/agentenv/internal/ctxio"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Options configure pulls (the `[image]` section of the node config).
type Options struct {
	// CacheDir holds layer blobs (blobs/sha256/<hex>) and conversions
	// (rootfs/<key>/). Required.
	CacheDir string
	// DefaultRegistry is used for references without a registry host
	// ("index.docker.io" when empty).
	DefaultRegistry string
	// AllowedRegistries, when not empty, lists the only registry hosts
	// (host[:port]) images may be pulled from.
	AllowedRegistries []string
	// InsecureRegistries are reached over plain HTTP (tests, local mirrors).
	// Loopback and private addresses use HTTP anyway.
	InsecureRegistries []string
	// Credentials per registry host, tried before the Docker config keychain.
	Credentials map[string]authn.AuthConfig
	// Keychain overrides the default (Docker config) keychain.
	Keychain authn.Keychain
	// Platform selected from an index (linux/amd64 when zero).
	Platform v1.Platform
	// Transport for registry requests (http.DefaultTransport when nil).
	Transport http.RoundTripper
	Log       *slog.Logger
}

// Image is a pulled image: its manifest digest, config and cached layers.
type Image struct {
	Ref    string  // the reference as resolved (registry/repo:tag or @digest)
	Digest v1.Hash // manifest digest (the platform child's, for an index)
	Config *v1.ConfigFile
	// RawConfig is the config as the registry served it (its sha256 is
	// the image ID Docker gives it).
	RawConfig []byte
	Layers    []Layer // bottom first
}

// Layer is one layer blob in the cache.
type Layer struct {
	Digest    v1.Hash // of the blob as stored (compressed)
	DiffID    v1.Hash // of the uncompressed tar
	MediaType types.MediaType
	Size      int64
	Path      string // cached blob file
}

// Puller pulls images into a cache directory.
type Puller struct {
	opt  Options
	keys authn.Keychain
}

// NewPuller checks opt and returns a Puller.
func NewPuller(opt Options) (*Puller, error) {
	if opt.CacheDir == "" {
		return nil, errors.New("oci: no cache directory")
	}
	if opt.Platform.OS == "" {
		opt.Platform = v1.Platform{OS: "linux", Architecture: "amd64"}
	}
	if opt.Log == nil {
		opt.Log = slog.Default()
	}
	if opt.Transport == nil {
		opt.Transport = http.DefaultTransport
	}
	keys := opt.Keychain
	if keys == nil {
		keys = authn.DefaultKeychain
	}
	if len(opt.Credentials) > 0 {
		keys = authn.NewMultiKeychain(staticKeychain(opt.Credentials), keys)
	}
	if err := os.MkdirAll(filepath.Join(opt.CacheDir, "blobs", "sha256"), 0o755); err != nil {
		return nil, fmt.Errorf("oci: create cache %s: %w", opt.CacheDir, err)
	}
	return &Puller{opt: opt, keys: keys}, nil
}

type staticKeychain map[string]authn.AuthConfig

func (k staticKeychain) Resolve(r authn.Resource) (authn.Authenticator, error) {
	if c, ok := k[r.RegistryStr()]; ok {
		return authn.FromConfig(c), nil
	}
	return authn.Anonymous, nil
}

// ErrRefused is a reference the node refuses to pull before asking any
// registry: malformed, of a registry not allowed, or (LoadTag) one that
// cannot be loaded under a tag. The caller's error, not a registry's.
var ErrRefused = errors.New("reference refused")

// ParseReference parses ref with the configured default registry and
// insecure registries, and checks it against the allowed registries.
func (p *Puller) ParseReference(ref string) (name.Reference, error) {
	var opts []name.Option
	if p.opt.DefaultRegistry != "" {
		opts = append(opts, name.WithDefaultRegistry(p.opt.DefaultRegistry))
	}
	r, err := name.ParseReference(ref, opts...)
	if err != nil {
		return nil, fmt.Errorf("oci: parse reference %q: %w: %w", ref, ErrRefused, err)
	}
	host := r.Context().RegistryStr()
	if slices.Contains(p.opt.InsecureRegistries, host) {
		r, err = name.ParseReference(ref, append(opts, name.Insecure)...)
		if err != nil {
			return nil, fmt.Errorf("oci: parse reference %q: %w: %w", ref, ErrRefused, err)
		}
	}
	if len(p.opt.AllowedRegistries) > 0 && !slices.Contains(p.opt.AllowedRegistries, host) {
		return nil, fmt.Errorf("oci: reference %q: %w: registry %s is not in the allowed registries %v", ref, ErrRefused, host, p.opt.AllowedRegistries)
	}
	return r, nil
}

func (p *Puller) remoteOptions(ctx context.Context) []remote.Option {
	return []remote.Option{
		remote.WithContext(ctx),
		remote.WithAuthFromKeychain(p.keys),
		remote.WithPlatform(p.opt.Platform),
		remote.WithTransport(p.opt.Transport),
		remote.WithRetryBackoff(remote.Backoff{Duration: 100 * time.Millisecond, Factor: 2, Steps: 3}),
	}
}

// Pull resolves ref (a tag or digest; an index resolves to its platform
// child), fetches the manifest and config and every layer blob not already
// cached, verifying each blob's digest.
func (p *Puller) Pull(ctx context.Context, ref string) (*Image, error) {
	r, err := p.ParseReference(ref)
	if err != nil {
		return nil, err
	}
	desc, err := remote.Get(r, p.remoteOptions(ctx)...)
	if err != nil {
		return nil, fmt.Errorf("oci: get manifest %s: %w", r, err)
	}
	img, err := desc.Image() // for an index: the child for the platform
	if err != nil {
		return nil, fmt.Errorf("oci: image %s for %s: %w", r, platformString(p.opt.Platform), err)
	}
	digest, err := img.Digest()
	if err != nil {
		return nil, fmt.Errorf("oci: manifest digest of %s: %w", r, err)
	}
	if d, ok := r.(name.Digest); ok && !desc.MediaType.IsIndex() && d.DigestStr() != digest.String() {
		return nil, fmt.Errorf("oci: manifest of %s has digest %s", r, digest)
	}
	raw, err := img.RawConfigFile()
	if err != nil {
		return nil, fmt.Errorf("oci: config of %s: %w", r, err)
	}
	cfg, err := v1.ParseConfigFile(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("oci: config of %s: %w", r, err)
	}
	if cfg.OS != "" && (cfg.OS != p.opt.Platform.OS || cfg.Architecture != p.opt.Platform.Architecture) {
		return nil, fmt.Errorf("oci: image %s is for %s/%s, want %s", r, cfg.OS, cfg.Architecture, platformString(p.opt.Platform))
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, fmt.Errorf("oci: layers of %s: %w", r, err)
	}
	if len(layers) != len(cfg.RootFS.DiffIDs) {
		return nil, fmt.Errorf("oci: image %s: %d layers but %d diff IDs in its config", r, len(layers), len(cfg.RootFS.DiffIDs))
	}
	out := &Image{Ref: r.String(), Digest: digest, Config: cfg, RawConfig: raw}
	for i, l := range layers {
		ld, err := l.Digest()
		if err != nil {
			return nil, fmt.Errorf("oci: layer %d digest of %s: %w", i, r, err)
		}
		if ld.Algorithm != "sha256" {
			return nil, fmt.Errorf("oci: layer %s of %s: unsupported digest algorithm", ld, r)
		}
		mt, err := l.MediaType()
		if err != nil {
			return nil, fmt.Errorf("oci: layer %s media type: %w", ld, err)
		}
		path, size, err := p.fetchLayer(ctx, ld, l)
		if err != nil {
			return nil, fmt.Errorf("oci: layer %s of %s: %w", ld, r, err)
		}
		out.Layers = append(out.Layers, Layer{Digest: ld, DiffID: cfg.RootFS.DiffIDs[i], MediaType: mt, Size: size, Path: path})
	}
	p.opt.Log.Info("oci: pulled", "ref", out.Ref, "digest", digest, "layers", len(out.Layers))
	return out, nil
}

func platformString(p v1.Platform) string { return p.OS + "/" + p.Architecture }

// BlobPath is where a blob with digest d is cached.
func (p *Puller) BlobPath(d v1.Hash) string {
	return filepath.Join(p.opt.CacheDir, "blobs", d.Algorithm, d.Hex)
}

// fetchLayer downloads a layer blob into the cache (unless present),
// verifying its sha256 digest before it is renamed into place.
func (p *Puller) fetchLayer(ctx context.Context, d v1.Hash, l v1.Layer) (string, int64, error) {
	if _, err := hex.DecodeString(d.Hex); err != nil || len(d.Hex) != 64 {
		return "", 0, fmt.Errorf("invalid digest %q", d)
	}
	dst := p.BlobPath(d)
	if fi, err := os.Stat(dst); err == nil {
		return dst, fi.Size(), nil
	}
	rc, err := l.Compressed()
	if err != nil {
		return "", 0, fmt.Errorf("fetch blob: %w", err)
	}
	defer rc.Close()
	var n int64
	err = atomicfile.Write(dst, 0o600, func(w io.Writer) error {
		h := sha256.New()
		var err error
		if n, err = io.Copy(io.MultiWriter(w, h), ctxio.Reader(ctx, rc)); err != nil {
			return fmt.Errorf("fetch blob: %w", err)
		}
		if got := hex.EncodeToString(h.Sum(nil)); got != d.Hex {
			return fmt.Errorf("blob digest mismatch: got sha256:%s", got)
		}
		return nil
	})
	if err != nil {
		return "", 0, fmt.Errorf("cache blob: %w", err)
	}
	return dst, n, nil
}
