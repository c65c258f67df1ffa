package repo_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/snapshot/repo/posix"
	"github.com/agentenv/agentenv/snapshot/repo/repotest"
)

// TestReadBlobParallel: a blob read as several ranges at once is the blob,
// whatever the number of parts; a stored object that differs from its
// digest, or a blob over the limit, is refused.
func TestReadBlobParallel(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	r, err := posix.Open(dir, repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := repotest.Random(3, 1<<20+17)
	b := repotest.PutRandom(t, r, 3, 1<<20+17)
	for _, parts := range []int{0, 1, 3, 4, 64} {
		got, err := repo.ReadBlobParallel(ctx, r, b, 2<<20, parts)
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("%d parts: %d bytes, %v", parts, len(got), err)
		}
	}
	if _, err := repo.ReadBlobParallel(ctx, r, b, 1<<20, 4); !errors.Is(err, repo.ErrInvalid) {
		t.Fatalf("a blob over the limit: %v", err)
	}
	path := filepath.Join(dir, repo.BlobKey(b.Digest))
	damaged := bytes.Clone(want)
	damaged[len(damaged)/2] ^= 1
	if err := os.WriteFile(path, damaged, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := repo.ReadBlobParallel(ctx, r, b, 2<<20, 4); !errors.Is(err, repo.ErrDigestMismatch) {
		t.Fatalf("a damaged object: %v", err)
	}
	if err := os.WriteFile(path, want[:100], 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := repo.ReadBlobParallel(ctx, r, b, 2<<20, 4); err == nil {
		t.Fatal("a truncated object was read")
	}
}
