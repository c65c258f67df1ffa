// Package repo owns the snapshot repository: the content-addressed store in
// which the sealed layers (rootfs and memory), VM states and configs of
// snapshots and templates live, so that any node sharing the repository can
// resume or create from them.
//
// Every artifact is a blob stored once under its sha256; a snapshot or
// template is a small manifest naming its blobs. The commit protocol (blobs
// first, each verified against its digest before it becomes visible; the
// manifest last, in one atomic put, refused while a blob it names is missing)
// and garbage collection (unreferenced blobs after a grace period, never racing
// a commit in progress) are written once here, over a Backend: a store of
// named objects put whole and atomically. The backends are a POSIX directory
// (package posix) and any S3-compatible object store (package s3); package
// repotest is the conformance suite both pass.
package repo

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// Errors callers tell apart with errors.Is.
var (
	ErrNotFound       = errors.New("not found")
	ErrDigestMismatch = errors.New("digest mismatch")
	ErrMissingBlob    = errors.New("manifest names a missing blob")
	ErrExists         = errors.New("a different manifest of that name exists")
	ErrInvalid        = errors.New("invalid")
)

// Digest names a blob by its content: "sha256:" and 64 lower-case hex digits.
type Digest string

// DigestOf returns the digest of b.
func DigestOf(b []byte) Digest {
	sum := sha256.Sum256(b)
	return Digest("sha256:" + hex.EncodeToString(sum[:]))
}

// FromHash returns the digest a sha256 hash has summed.
func FromHash(sum []byte) Digest { return Digest("sha256:" + hex.EncodeToString(sum)) }

// Validate checks the form of d.
func (d Digest) Validate() error {
	h, ok := strings.CutPrefix(string(d), "sha256:")
	if !ok || len(h) != 64 {
		return fmt.Errorf("digest %.80q: %w (want sha256:<64 hex>)", string(d), ErrInvalid)
	}
	for _, c := range []byte(h) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return fmt.Errorf("digest %.80q: %w (want lower-case hex)", string(d), ErrInvalid)
		}
	}
	return nil
}

// Hex returns the hex part of d.
func (d Digest) Hex() string { return strings.TrimPrefix(string(d), "sha256:") }

// Repository is what a node uses of a snapshot repository.
type Repository interface {
	// PutBlob stores size bytes read from r under d. They become visible only
	// when all were read and their sha256 is d; a blob that is present
	// already is not uploaded again (r is not read).
	PutBlob(ctx context.Context, d Digest, size int64, r io.Reader) error
	// StatBlob returns the size of a present blob (ErrNotFound otherwise).
	StatBlob(ctx context.Context, d Digest) (int64, error)
	// ReadBlob reads n bytes of blob d from off (n < 0: to its end).
	ReadBlob(ctx context.Context, d Digest, off, n int64) (io.ReadCloser, error)
	// Commit makes m visible under m.Name, after checking that every blob
	// it names is present with its size; an identical manifest already
	// there is success, a different one ErrExists.
	Commit(ctx context.Context, m *Manifest) error
	// Manifest reads and validates a committed manifest.
	Manifest(ctx context.Context, name string) (*Manifest, error)
	// Manifests lists the names of committed manifests, sorted.
	Manifests(ctx context.Context) ([]string, error)
	// DeleteManifest removes a manifest (its blobs go with the next GC).
	DeleteManifest(ctx context.Context, name string) error
	// GC removes blobs no manifest references and that are older than the
	// grace period, never racing a commit in progress.
	GC(ctx context.Context, opt GCOptions) (GCStats, error)
}

// ObjectInfo describes a stored object. ModTime is the store's clock (the
// server's for S3), so ages compared within one store need no synchronized
// clocks between nodes.
type ObjectInfo struct {
	Key     string
	Size    int64
	ModTime time.Time
}

// Backend is a store of named objects, put whole and atomically. Keys are
// slash-separated paths of the repository's own making ("blobs/sha256/<hex>",
// "manifests/<name>", ...).
type Backend interface {
	// Put stores size bytes read from r under key, replacing what is there.
	// check, when not nil, runs after r is read to its end and before the
	// object becomes visible; its error leaves the key untouched. A failed or
	// cancelled put never leaves a partial object under key.
	Put(ctx context.Context, key string, r io.Reader, size int64, check func() error) error
	// Get reads n bytes of key from off (n < 0: to its end); ErrNotFound.
	Get(ctx context.Context, key string, off, n int64) (io.ReadCloser, error)
	// Stat describes key; ErrNotFound.
	Stat(ctx context.Context, key string) (ObjectInfo, error)
	// List describes every object whose key starts with prefix (a directory
	// prefix ending in "/"), in no particular order.
	List(ctx context.Context, prefix string) ([]ObjectInfo, error)
	// Delete removes key; a missing key is not an error.
	Delete(ctx context.Context, key string) error
	// String names the store in logs and errors (no credentials).
	String() string
}

// Options tune a Repo.
type Options struct {
	// LeaseTTL bounds how long a commit's lease protects its blobs from GC
	// and how long a GC run's marker holds commits back; a commit that takes
	// longer between its lease and its manifest gives up. Default 10 min.
	LeaseTTL time.Duration
	// PollInterval is how often a commit looks again while a GC runs.
	// Default 500 ms.
	PollInterval time.Duration
}

// Repo is the Repository over a Backend.
type Repo struct {
	b   Backend
	opt Options
}

// New returns the repository stored in b.
func New(b Backend, opt Options) *Repo {
	if opt.LeaseTTL <= 0 {
		opt.LeaseTTL = 10 * time.Minute
	}
	if opt.PollInterval <= 0 {
		opt.PollInterval = 500 * time.Millisecond
	}
	return &Repo{b: b, opt: opt}
}

// Backend returns the store the repository lives in.
func (r *Repo) Backend() Backend { return r.b }

func (r *Repo) String() string { return r.b.String() }

// Key prefixes of the layout (docs/repository.md).
const (
	blobPrefix     = "blobs/sha256/"
	manifestPrefix = "manifests/"
	leasePrefix    = "leases/"
	gcPrefix       = "gc/"
)

// BlobKey is the key of blob d.
func BlobKey(d Digest) string { return blobPrefix + d.Hex() }

func manifestKey(name string) string { return manifestPrefix + name }

// PutBlob implements Repository.
func (r *Repo) PutBlob(ctx context.Context, d Digest, size int64, src io.Reader) error {
	if err := d.Validate(); err != nil {
		return fmt.Errorf("put blob: %w", err)
	}
	if size < 0 {
		return fmt.Errorf("put blob %s: negative size: %w", d, ErrInvalid)
	}
	if n, err := r.StatBlob(ctx, d); err == nil && n == size {
		return nil
	} else if err != nil && !errors.Is(err, ErrNotFound) {
		return fmt.Errorf("put blob %s: %w", d, err)
	}
	h := sha256.New()
	cr := &countReader{r: io.TeeReader(src, h)}
	check := func() error {
		// One byte past size tells a longer source from an exact one.
		var one [1]byte
		if n, _ := io.ReadFull(cr, one[:]); n > 0 {
			return fmt.Errorf("put blob %s: source longer than %d bytes: %w", d, size, ErrDigestMismatch)
		}
		if cr.n != size {
			return fmt.Errorf("put blob %s: read %d of %d bytes: %w", d, cr.n, size, ErrDigestMismatch)
		}
		if got := FromHash(h.Sum(nil)); got != d {
			return fmt.Errorf("put blob %s: uploaded bytes are %s: %w", d, got, ErrDigestMismatch)
		}
		return nil
	}
	if err := r.b.Put(ctx, BlobKey(d), io.LimitReader(cr, size), size, check); err != nil {
		return fmt.Errorf("put blob %s to %s: %w", d, r.b, err)
	}
	return nil
}

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// StatBlob implements Repository.
func (r *Repo) StatBlob(ctx context.Context, d Digest) (int64, error) {
	if err := d.Validate(); err != nil {
		return 0, fmt.Errorf("stat blob: %w", err)
	}
	info, err := r.b.Stat(ctx, BlobKey(d))
	if err != nil {
		return 0, fmt.Errorf("stat blob %s in %s: %w", d, r.b, err)
	}
	return info.Size, nil
}

// ReadBlob implements Repository.
func (r *Repo) ReadBlob(ctx context.Context, d Digest, off, n int64) (io.ReadCloser, error) {
	if err := d.Validate(); err != nil {
		return nil, fmt.Errorf("read blob: %w", err)
	}
	if off < 0 {
		return nil, fmt.Errorf("read blob %s: negative offset: %w", d, ErrInvalid)
	}
	rc, err := r.b.Get(ctx, BlobKey(d), off, n)
	if err != nil {
		return nil, fmt.Errorf("read blob %s [%d,+%d) from %s: %w", d, off, n, r.b, err)
	}
	return rc, nil
}

// Manifests implements Repository.
func (r *Repo) Manifests(ctx context.Context) ([]string, error) {
	objs, err := r.b.List(ctx, manifestPrefix)
	if err != nil {
		return nil, fmt.Errorf("list manifests in %s: %w", r.b, err)
	}
	names := make([]string, 0, len(objs))
	for _, o := range objs {
		name := strings.TrimPrefix(o.Key, manifestPrefix)
		if ValidName(name) == nil {
			names = append(names, name)
		}
	}
	sortStrings(names)
	return names, nil
}

// Manifest implements Repository.
func (r *Repo) Manifest(ctx context.Context, name string) (*Manifest, error) {
	if err := ValidName(name); err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	data, err := r.readSmall(ctx, manifestKey(name), MaxManifestSize)
	if err != nil {
		return nil, fmt.Errorf("read manifest %s from %s: %w", name, r.b, err)
	}
	m, err := ParseManifest(data)
	if err != nil {
		return nil, fmt.Errorf("read manifest %s from %s: %w", name, r.b, err)
	}
	if m.Name != name {
		return nil, fmt.Errorf("read manifest %s from %s: it names itself %q: %w", name, r.b, m.Name, ErrInvalid)
	}
	return m, nil
}

// DeleteManifest implements Repository.
func (r *Repo) DeleteManifest(ctx context.Context, name string) error {
	if err := ValidName(name); err != nil {
		return fmt.Errorf("delete manifest: %w", err)
	}
	if err := r.b.Delete(ctx, manifestKey(name)); err != nil {
		return fmt.Errorf("delete manifest %s in %s: %w", name, r.b, err)
	}
	return nil
}

// readSmall reads a whole object of at most limit bytes: an object from the
// store is untrusted, so its size is checked before anything is allocated.
func (r *Repo) readSmall(ctx context.Context, key string, limit int64) ([]byte, error) {
	info, err := r.b.Stat(ctx, key)
	if err != nil {
		return nil, err
	}
	if info.Size > limit {
		return nil, fmt.Errorf("%s is %d bytes, more than the %d allowed: %w", key, info.Size, limit, ErrInvalid)
	}
	rc, err := r.b.Get(ctx, key, 0, -1)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("%s grew past the %d bytes allowed: %w", key, limit, ErrInvalid)
	}
	return data, nil
}
