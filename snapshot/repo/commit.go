package repo

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/agentenv/agentenv/internal/failpoint"
)

// Fault points of the commit protocol: a crash at any of them leaves either
// no manifest or a complete one, and at most a lease that GC drops once
// stale.
var (
	fpLeased    = failpoint.New("repo/commit/leased")
	fpVerified  = failpoint.New("repo/commit/verified")
	fpCommitted = failpoint.New("repo/commit/manifest-written")
	fpGCMarked  = failpoint.New("repo/gc/marked")
)

// maxLeaseSize bounds a lease read back by GC (a few thousand digests).
const maxLeaseSize = 256 << 10

// lease is what a commit in progress holds in the store: the blobs it is
// about to reference, which GC must keep while the lease is fresh.
type lease struct {
	Manifest string   `json:"manifest"`
	Blobs    []Digest `json:"blobs"`
}

func randomID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Commit implements Repository. The protocol (docs/repository.md):
//  1. write a lease naming the manifest's blobs, then look for GC markers; a
//     live one (a GC run in progress) is waited out and the lease written
//     again. A GC writes its marker before it reads the leases, so of any
//     commit and GC at least one sees the other;
//  2. check that every blob is present with its size (a commit never
//     points at a missing blob);
//  3. put the manifest, within half the lease's lifetime of step 1;
//  4. drop the lease.
func (r *Repo) Commit(ctx context.Context, m *Manifest) error {
	data, err := m.Encode()
	if err != nil {
		return fmt.Errorf("commit manifest: %w", err)
	}
	if done, err := r.sameManifest(ctx, m.Name, data); done || err != nil {
		return err
	}
	key, start, err := r.acquireLease(ctx, m)
	if err != nil {
		return fmt.Errorf("commit manifest %s to %s: %w", m.Name, r.b, err)
	}
	defer func() {
		if err := r.b.Delete(context.WithoutCancel(ctx), key); err != nil {
			slog.Warn("repository: dropping a commit lease failed; GC drops it once stale", "lease", key, "err", err)
		}
	}()
	if err := fpLeased.Inject(); err != nil {
		return fmt.Errorf("commit manifest %s: %w", m.Name, err)
	}
	if err := r.checkBlobs(ctx, m); err != nil {
		return fmt.Errorf("commit manifest %s to %s: %w", m.Name, r.b, err)
	}
	if err := fpVerified.Inject(); err != nil {
		return fmt.Errorf("commit manifest %s: %w", m.Name, err)
	}
	deadline := start.Add(r.opt.LeaseTTL / 2)
	if time.Now().After(deadline) {
		return fmt.Errorf("commit manifest %s to %s: the lease aged past %s before the manifest was written; retry",
			m.Name, r.b, r.opt.LeaseTTL/2)
	}
	pctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	if err := r.b.Put(pctx, manifestKey(m.Name), bytes.NewReader(data), int64(len(data)), nil); err != nil {
		return fmt.Errorf("commit manifest %s to %s: %w", m.Name, r.b, err)
	}
	if err := fpCommitted.Inject(); err != nil {
		return fmt.Errorf("commit manifest %s: %w", m.Name, err)
	}
	return nil
}

// sameManifest reports whether name already holds exactly data (a retried
// commit), and ErrExists when it holds something else.
func (r *Repo) sameManifest(ctx context.Context, name string, data []byte) (bool, error) {
	old, err := r.readSmall(ctx, manifestKey(name), MaxManifestSize)
	switch {
	case errors.Is(err, ErrNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("commit manifest %s to %s: %w", name, r.b, err)
	case bytes.Equal(old, data):
		return true, nil
	}
	return false, fmt.Errorf("commit manifest %s to %s: %w", name, r.b, ErrExists)
}

// acquireLease writes the commit's lease and returns once no GC run is in
// progress, with the local time just before the last lease write.
func (r *Repo) acquireLease(ctx context.Context, m *Manifest) (string, time.Time, error) {
	l := lease{Manifest: m.Name}
	for _, b := range m.Blobs() {
		l.Blobs = append(l.Blobs, b.Digest)
	}
	data, err := json.Marshal(l)
	if err != nil {
		return "", time.Time{}, err
	}
	key := leasePrefix + randomID()
	for {
		start := time.Now()
		if err := r.b.Put(ctx, key, bytes.NewReader(data), int64(len(data)), nil); err != nil {
			return "", time.Time{}, fmt.Errorf("write lease: %w", err)
		}
		busy, err := r.gcRunning(ctx, key)
		if err != nil {
			_ = r.b.Delete(context.WithoutCancel(ctx), key)
			return "", time.Time{}, fmt.Errorf("look for a garbage collection in progress: %w", err)
		}
		if !busy {
			return key, start, nil
		}
		select {
		case <-ctx.Done():
			_ = r.b.Delete(context.WithoutCancel(ctx), key)
			return "", time.Time{}, fmt.Errorf("waiting for a garbage collection in progress: %w", ctx.Err())
		case <-time.After(r.opt.PollInterval):
		}
	}
}

// gcRunning reports whether a fresh GC marker exists, judged by the store's
// clock (the modification time of the lease just written).
func (r *Repo) gcRunning(ctx context.Context, leaseKey string) (bool, error) {
	self, err := r.b.Stat(ctx, leaseKey)
	if err != nil {
		return false, fmt.Errorf("stat own lease: %w", err)
	}
	markers, err := r.b.List(ctx, gcPrefix)
	if err != nil {
		return false, fmt.Errorf("list gc markers: %w", err)
	}
	for _, mk := range markers {
		if self.ModTime.Sub(mk.ModTime) < r.opt.LeaseTTL {
			return true, nil
		}
	}
	return false, nil
}

// checkBlobs checks that every blob m names is present with its size.
func (r *Repo) checkBlobs(ctx context.Context, m *Manifest) error {
	for _, b := range m.Blobs() {
		info, err := r.b.Stat(ctx, BlobKey(b.Digest))
		if errors.Is(err, ErrNotFound) {
			return fmt.Errorf("blob %s: %w", b.Digest, ErrMissingBlob)
		}
		if err != nil {
			return fmt.Errorf("stat blob %s: %w", b.Digest, err)
		}
		if info.Size != b.Size {
			return fmt.Errorf("blob %s is %d bytes in the store, the manifest says %d: %w", b.Digest, info.Size, b.Size, ErrMissingBlob)
		}
	}
	return nil
}
