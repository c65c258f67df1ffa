package posix_test

import (
	"context"
	"errors"
	"testing"

	"github.com/agentenv/agentenv/internal/failpoint"
	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/snapshot/repo/posix"
	"github.com/agentenv/agentenv/snapshot/repo/repotest"
)

// TestCommitFaults: an error at each fault point of a commit leaves no
// manifest (before the write) or the complete one (after it, and a retry
// succeeds), and never a lease; an error after GC's mark leaves no marker
// and deletes nothing. Not parallel: fault points are process-wide.
func TestCommitFaults(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		point   string
		visible bool
	}{
		{"repo/commit/leased", false},
		{"repo/commit/verified", false},
		{"repo/commit/manifest-written", true},
	} {
		b, err := posix.NewBackend(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		r := repo.New(b, repo.Options{})
		m := repotest.NewManifest(t, r, "snap", 1)
		if err := failpoint.Arm(c.point, "error"); err != nil {
			t.Fatal(err)
		}
		err = r.Commit(ctx, m)
		failpoint.Arm(c.point, "")
		if !errors.Is(err, failpoint.ErrInjected) {
			t.Fatalf("%s: commit gave %v", c.point, err)
		}
		_, err = r.Manifest(ctx, "snap")
		if c.visible != (err == nil) {
			t.Fatalf("%s: manifest visible %v, want %v (%v)", c.point, err == nil, c.visible, err)
		}
		if leases, _ := b.List(ctx, "leases/"); len(leases) != 0 {
			t.Fatalf("%s: the failed commit left a lease", c.point)
		}
		if err := r.Commit(ctx, m); err != nil {
			t.Fatalf("%s: the retried commit: %v", c.point, err)
		}
	}

	b, _ := posix.NewBackend(t.TempDir())
	r := repo.New(b, repo.Options{})
	orphan := repotest.PutRandom(t, r, 9, 100)
	failpoint.Arm("repo/gc/marked", "error")
	_, err := r.GC(ctx, repo.GCOptions{})
	failpoint.Arm("repo/gc/marked", "")
	if !errors.Is(err, failpoint.ErrInjected) {
		t.Fatalf("gc: %v", err)
	}
	if markers, _ := b.List(ctx, "gc/"); len(markers) != 0 {
		t.Fatal("the failed gc left its marker")
	}
	if _, err := r.StatBlob(ctx, orphan.Digest); err != nil {
		t.Fatalf("the failed gc deleted: %v", err)
	}
}
