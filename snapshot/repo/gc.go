package repo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
)

// GCOptions tune one garbage collection.
type GCOptions struct {
	// Grace keeps an unreferenced blob younger than this (by the store's
	// clock): blobs of an upload whose manifest is not committed yet.
	Grace time.Duration
	// DryRun reports what would go without deleting anything.
	DryRun bool
}

// GCStats says what one garbage collection did.
type GCStats struct {
	Manifests  int      // manifests read
	Referenced int      // distinct blobs they reference
	Protected  int      // blobs kept only because a commit in progress holds them
	Young      int      // unreferenced blobs kept for the grace period
	Deleted    []Digest // blobs removed (or, in a dry run, that would be)
	Freed      int64    // their bytes
}

// StaleCleaner is implemented by backends that leave their own leftovers
// (an interrupted upload's staging object, a crash's temporary file); GC
// asks them to remove what is older than before.
type StaleCleaner interface {
	CleanStale(ctx context.Context, before time.Time) (int, error)
}

// GC implements Repository: mark (a marker object with the store's clock),
// then the live leases, then the manifests, then sweep. The order matters:
// a commit's lease is either seen here or the commit sees the marker and
// waits, and a commit whose lease is already gone wrote its manifest before
// the manifests are listed.
func (r *Repo) GC(ctx context.Context, opt GCOptions) (GCStats, error) {
	var st GCStats
	start := time.Now()
	key := gcPrefix + randomID()
	marker := []byte(fmt.Sprintf(`{"started":%q}`, start.UTC().Format(time.RFC3339Nano)))
	if err := r.b.Put(ctx, key, bytes.NewReader(marker), int64(len(marker)), nil); err != nil {
		return st, fmt.Errorf("gc %s: write marker: %w", r.b, err)
	}
	defer func() {
		if err := r.b.Delete(context.WithoutCancel(ctx), key); err != nil {
			slog.Warn("repository: dropping the gc marker failed; it goes stale", "marker", key, "err", err)
		}
	}()
	self, err := r.b.Stat(ctx, key)
	if err != nil {
		return st, fmt.Errorf("gc %s: stat marker: %w", r.b, err)
	}
	now := self.ModTime
	if err := fpGCMarked.Inject(); err != nil {
		return st, fmt.Errorf("gc %s: %w", r.b, err)
	}
	keep, err := r.liveLeases(ctx, now, key, opt.DryRun)
	if err != nil {
		return st, fmt.Errorf("gc %s: %w", r.b, err)
	}
	refs, n, err := r.referenced(ctx)
	if err != nil {
		return st, fmt.Errorf("gc %s: %w", r.b, err)
	}
	st.Manifests, st.Referenced = n, len(refs)
	if err := r.sweep(ctx, now, start, opt, refs, keep, &st); err != nil {
		return st, fmt.Errorf("gc %s: %w", r.b, err)
	}
	if c, ok := r.b.(StaleCleaner); ok && !opt.DryRun {
		if _, err := c.CleanStale(ctx, now.Add(-max(opt.Grace, r.opt.LeaseTTL))); err != nil {
			return st, fmt.Errorf("gc %s: clean stale uploads: %w", r.b, err)
		}
	}
	return st, nil
}

// liveLeases returns the blobs fresh leases hold; stale leases (a commit
// that died) and stale markers of other GC runs are removed.
func (r *Repo) liveLeases(ctx context.Context, now time.Time, self string, dry bool) (map[Digest]bool, error) {
	keep := map[Digest]bool{}
	leases, err := r.b.List(ctx, leasePrefix)
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	for _, o := range leases {
		if now.Sub(o.ModTime) >= r.opt.LeaseTTL {
			if !dry {
				_ = r.b.Delete(ctx, o.Key)
			}
			continue
		}
		l, err := r.readLease(ctx, o.Key)
		if errors.Is(err, ErrNotFound) {
			continue // the commit finished meanwhile: its manifest is listed next
		}
		if err != nil {
			return nil, err
		}
		for _, d := range l.Blobs {
			keep[d] = true
		}
	}
	markers, err := r.b.List(ctx, gcPrefix)
	if err != nil {
		return nil, fmt.Errorf("list gc markers: %w", err)
	}
	for _, o := range markers {
		if o.Key != self && now.Sub(o.ModTime) >= r.opt.LeaseTTL && !dry {
			_ = r.b.Delete(ctx, o.Key)
		}
	}
	return keep, nil
}

// readLease reads a lease; one that cannot be parsed while fresh stops the
// collection, since what it protects is unknown.
func (r *Repo) readLease(ctx context.Context, key string) (*lease, error) {
	data, err := r.readSmall(ctx, key, maxLeaseSize)
	if err != nil {
		return nil, fmt.Errorf("read lease %s: %w", key, err)
	}
	var l lease
	if err := json.Unmarshal(data, &l); err != nil {
		return nil, fmt.Errorf("read lease %s: %w: %w", key, ErrInvalid, err)
	}
	for _, d := range l.Blobs {
		if err := d.Validate(); err != nil {
			return nil, fmt.Errorf("read lease %s: %w", key, err)
		}
	}
	return &l, nil
}

// referenced reads every manifest; one that cannot be read stops the
// collection (its blobs might be deleted otherwise).
func (r *Repo) referenced(ctx context.Context) (map[Digest]bool, int, error) {
	names, err := r.Manifests(ctx)
	if err != nil {
		return nil, 0, err
	}
	refs := map[Digest]bool{}
	n := 0
	for _, name := range names {
		m, err := r.Manifest(ctx, name)
		if errors.Is(err, ErrNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, 0, fmt.Errorf("%w (garbage collection needs every manifest readable)", err)
		}
		n++
		for _, b := range m.Blobs() {
			refs[b.Digest] = true
		}
	}
	return refs, n, nil
}

func (r *Repo) sweep(ctx context.Context, now, start time.Time, opt GCOptions, refs, keep map[Digest]bool, st *GCStats) error {
	blobs, err := r.b.List(ctx, blobPrefix)
	if err != nil {
		return fmt.Errorf("list blobs: %w", err)
	}
	present := map[Digest]bool{} // blobs that stay: their hints stay too
	for _, o := range blobs {
		d := Digest("sha256:" + strings.TrimPrefix(o.Key, blobPrefix))
		present[d] = true
		switch {
		case d.Validate() != nil || refs[d]:
			continue
		case keep[d]:
			st.Protected++
			continue
		case now.Sub(o.ModTime) < opt.Grace:
			st.Young++
			continue
		}
		// Past half the lease lifetime a commit may judge this run's
		// marker stale and go ahead: stop sweeping before that.
		if time.Since(start) >= r.opt.LeaseTTL/2 {
			return fmt.Errorf("ran out of time after %d deletions; run again", len(st.Deleted))
		}
		if !opt.DryRun {
			if err := r.b.Delete(ctx, o.Key); err != nil {
				return fmt.Errorf("delete blob %s: %w", d, err)
			}
		}
		delete(present, d)
		st.Deleted = append(st.Deleted, d)
		st.Freed += o.Size
	}
	return r.sweepHints(ctx, present, opt.DryRun)
}
