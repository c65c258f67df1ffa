package e2e

import (
	"context"
	"crypto/sha256"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/agentenv/agentenv/snapshot/repo"
	_ "github.com/agentenv/agentenv/snapshot/repo/upload" // declares the upload/... fault points
)

// TestUploadCrash kills aenvd with SIGKILL at the two fault points of a
// pause's background upload to the repository: once the job is claimed
// (nothing uploaded yet) and once its manifest is committed (the queue not
// told yet). After the restart the queue finishes the upload (or finds it
// done): the repository holds the pause with every blob as its digest says,
// and the sandbox resumes on the node with every byte written before.
func TestUploadCrash(t *testing.T) {
	n := sharedNode(t)
	for _, point := range []string{"upload/claimed", "upload/committed"} {
		t.Run(point, func(t *testing.T) {
			id := n.create(t, `{"templateID":"base","timeout":300}`)
			data := n.writeData(t, id, "u")
			n.crashAt(t, point, func() { _, _, _, _ = n.Call("POST", "/sandboxes/"+id+"/pause", n.key, "") })
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			r, _, m := committedPause(ctx, t, n, id)
			checkTopBlobs(ctx, t, r, m)
			n.resumeAndCheck(t, id, data)
			n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, n.key, "")
			n.checkNoOrphans(t)
		})
	}
}

// checkBlob reads a blob back whole and checks its size and digest.
func checkBlob(ctx context.Context, t *testing.T, r *repo.Repo, b repo.Blob) {
	t.Helper()
	rc, err := r.ReadBlob(ctx, b.Digest, 0, -1)
	if err != nil {
		t.Fatalf("blob %s: %v", b.Digest, err)
	}
	defer rc.Close()
	h := sha256.New()
	got, err := io.Copy(h, rc)
	if err != nil || got != b.Size || repo.FromHash(h.Sum(nil)) != b.Digest {
		t.Fatalf("blob %s: %d bytes (want %d), %v", b.Digest, got, b.Size, err)
	}
}
