package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentenv/agentenv/snapshot/repo"
	"github.com/agentenv/agentenv/snapshot/repo/posix"
)

// TestPauseCommitsToRepository: a pause stays synchronous and durable on
// the node, and its state is then committed to the node's repository in
// the background: a manifest of the sandbox's generation naming rootfs and
// memory layers, a VM state and config, each blob stored under its digest;
// the sandbox resumes with its data meanwhile.
func TestPauseCommitsToRepository(t *testing.T) {
	n := sharedNode(t)
	id := n.create(t, `{"templateID":"base","timeout":300}`)
	data := n.writeData(t, id, "repo")
	n.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", n.key, "")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	r, name, m := committedPause(ctx, t, n, id)
	if m.Kind != repo.KindSnapshot || m.Parent != "base" || len(m.Rootfs) < 2 || len(m.Memory) < 2 {
		t.Fatalf("manifest %s: kind %s, parent %q, %d rootfs and %d memory layers", name, m.Kind, m.Parent, len(m.Rootfs), len(m.Memory))
	}
	// The sandbox's own top layers (small) read back as their digests say.
	checkTopBlobs(ctx, t, r, m)
	n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", n.key, `{"timeout":120}`)
	n.checkData(t, id, data)

	// A snapshot is committed too, and says so.
	var snap struct {
		SnapshotID string `json:"snapshotID"`
		Repository string `json:"repository"`
	}
	if err := json.Unmarshal(n.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/snapshots", n.key, `{}`), &snap); err != nil {
		t.Fatal(err)
	}
	for snap.Repository != "uploaded" {
		if snap.Repository == "failed" || ctx.Err() != nil {
			t.Fatalf("snapshot %s: repository %q", snap.SnapshotID, snap.Repository)
		}
		time.Sleep(time.Second)
		if err := json.Unmarshal(n.expect(t, http.StatusOK, "GET", "/snapshots/"+snap.SnapshotID, n.key, ""), &snap); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := r.Manifest(ctx, "snapshot-"+snap.SnapshotID); err != nil {
		t.Fatalf("snapshot %s uploaded, but: %v", snap.SnapshotID, err)
	}
	n.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, n.key, "")
	n.expect(t, http.StatusNoContent, "DELETE", "/snapshots/"+snap.SnapshotID, n.key, "")
}

// waitManifest waits for a manifest whose name starts with prefix.
// committedPause opens the node's repository and waits for the manifest
// of sandbox id's pause.
func committedPause(ctx context.Context, t *testing.T, n *node, id string) (*repo.Repo, string, *repo.Manifest) {
	t.Helper()
	r, err := posix.Open(filepath.Join(n.DataDir, "repository"), repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	name := waitManifest(ctx, t, r, "sandbox-"+id+"-")
	m, err := r.Manifest(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return r, name, m
}

// checkTopBlobs reads the manifest's own top layers (small), state and
// config back whole and checks their sizes and digests.
func checkTopBlobs(ctx context.Context, t *testing.T, r *repo.Repo, m *repo.Manifest) {
	t.Helper()
	for _, b := range []repo.Blob{m.Rootfs[len(m.Rootfs)-1].Blob, m.Memory[len(m.Memory)-1].Blob, m.State, m.Config} {
		checkBlob(ctx, t, r, b)
	}
}

func waitManifest(ctx context.Context, t *testing.T, r *repo.Repo, prefix string) string {
	t.Helper()
	for {
		names, err := r.Manifests(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, nm := range names {
			if strings.HasPrefix(nm, prefix) {
				return nm
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("no manifest %s* in the repository (has %v)", prefix, names)
		case <-time.After(time.Second):
		}
	}
}

// TestResumeOnAnotherNode: a sandbox paused on node A resumes on node B,
// which shares A's repository but has never seen the sandbox: B brings its
// layers, state and record from the repository at the connect, and E2B's
// SDK finds there every file written on A (after dropping B's guest cache),
// a file in tmpfs and a process that was running at the pause. A crash of B
// in the middle of bringing it (the import's fault point) leaves nothing.
// And a snapshot taken on A serves creates on B by its id.
func TestResumeOnAnotherNode(t *testing.T) {
	a := sharedNode(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	b := repoPeer(ctx, t, "adrepo", 97, sharesRepo(a)...)

	id := a.create(t, `{"templateID":"base","timeout":300}`)
	data := a.writeData(t, id, "moved")
	a.sh(t, id, `echo in-tmpfs > /dev/shm/marker; nohup sleep 100000 >/dev/null 2>&1 & echo $! > /home/user/sleeper.pid; sync`)
	a.expect(t, http.StatusNoContent, "POST", "/sandboxes/"+id+"/pause", a.key, "")
	r, err := posix.Open(filepath.Join(a.DataDir, "repository"), repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	waitManifest(ctx, t, r, "sandbox-"+id+"-")

	b.expect(t, http.StatusNotFound, "GET", "/sandboxes/"+id, b.key, "")
	// A crash of B after the fetch, before the record: the next start
	// removes what it fetched, and the sandbox is still to be brought.
	b.crashAt(t, "orchestrator/import/fetched", func() {
		_, _, _, _ = b.Call("POST", "/sandboxes/"+id+"/connect", b.key, `{"timeout":120}`)
	})
	if _, ok := b.listed(t)[id]; ok || fileExists(filepath.Join(b.DataDir, "sandboxes", id)) {
		t.Fatalf("an import crashed before its record left sandbox %s on node B (listed %v)", id, ok)
	}
	b.expect(t, http.StatusCreated, "POST", "/sandboxes/"+id+"/connect", b.key, `{"timeout":120}`)
	b.sdkCheck(t, id, data)
	if got := b.sh(t, id, `cat /dev/shm/marker; kill -0 $(cat /home/user/sleeper.pid) && echo alive`); got != "in-tmpfs\nalive" {
		t.Fatalf("on node B: tmpfs and process read %q", got)
	}
	b.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, b.key, "")
	a.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+id, a.key, "")

	// A snapshot taken on A: B creates a sandbox from it by its id.
	src := a.create(t, `{"templateID":"base","timeout":300}`)
	snapData := a.writeData(t, src, "snapped")
	var snap struct {
		SnapshotID string `json:"snapshotID"`
		Repository string `json:"repository"`
	}
	if err := json.Unmarshal(a.expect(t, http.StatusCreated, "POST", "/sandboxes/"+src+"/snapshots", a.key, `{}`), &snap); err != nil {
		t.Fatal(err)
	}
	for snap.Repository != "uploaded" {
		if snap.Repository == "failed" || ctx.Err() != nil {
			t.Fatalf("snapshot %s: repository %q", snap.SnapshotID, snap.Repository)
		}
		time.Sleep(time.Second)
		_ = json.Unmarshal(a.expect(t, http.StatusOK, "GET", "/snapshots/"+snap.SnapshotID, a.key, ""), &snap)
	}
	child := b.create(t, `{"templateID":"`+snap.SnapshotID+`","timeout":120}`)
	b.sdkCheck(t, child, snapData)
	b.expect(t, http.StatusOK, "GET", "/snapshots/"+snap.SnapshotID, b.key, "")
	b.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+child, b.key, "")
	a.expect(t, http.StatusNoContent, "DELETE", "/sandboxes/"+src, a.key, "")
	// An id no node ever paused stays unknown.
	b.expect(t, http.StatusNotFound, "POST", "/sandboxes/nosuchsandbox00000000/connect", b.key, `{"timeout":60}`)
}
