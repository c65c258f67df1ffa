package replica

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/agentenv/agentenv/snapshot/repo/upload"
)

// queueOf is an upload queue in memory: the Uploads the replica's
// cancellations are checked against (the real queue's own behaviour is
// upload.TestCancel's).
type queueOf struct{ jobs []string }

func (q *queueOf) Commit(_ context.Context, j upload.Job) error {
	q.jobs = append(q.jobs, j.Name)
	return nil
}
func (q *queueOf) Status(string) (upload.Status, bool) { return upload.Status{}, false }
func (q *queueOf) Forget(string) error                 { return nil }
func (q *queueOf) Cancel(name string) error {
	q.jobs = slices.DeleteFunc(q.jobs, func(n string) bool { return n == name })
	return nil
}
func (q *queueOf) Queued() []upload.Status {
	var out []upload.Status
	for _, n := range q.jobs {
		out = append(out, upload.Status{Name: n})
	}
	return out
}

// holder is a node holding the sandboxes named (the rest of Node is not
// reached by the cancellations).
type holder struct {
	Node
	held map[string]bool
}

func (h holder) Holds(id string) bool { return h.held[id] }

func TestPauseOf(t *testing.T) {
	for name, want := range map[string]string{
		ManifestOfPause("abc123", 7): "abc123", "sandbox-a-b-2": "a-b",
		"snapshot-abc": "", "sandbox-abc": "", "sandbox--3": "", "sandbox-abc-x": "",
	} {
		id, ok := PauseOf(name)
		if id != want || ok != (want != "") {
			t.Errorf("PauseOf(%q) = %q %v, want %q", name, id, ok, want)
		}
	}
}

// TestUploadsCancelled: removing a sandbox cancels the uploads of its
// staged pauses, and at start the queued pauses of sandboxes the node no
// longer holds are cancelled; other jobs stay.
func TestUploadsCancelled(t *testing.T) {
	q := &queueOf{jobs: []string{ManifestOfPause("gone", 2), ManifestOfPause("kept", 1), ManifestOfPause("killed", 3),
		ManifestOfPause("killed", 4), ManifestOfSnapshot("snap")}}
	node := holder{held: map[string]bool{}}
	r := New(Options{Uploads: q, Logger: slog.New(slog.DiscardHandler)}, node)
	dir := t.TempDir()
	for _, d := range []string{"upload-3", "upload-4"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	r.CancelPauseUploads("killed", dir)
	if want := []string{ManifestOfPause("gone", 2), ManifestOfPause("kept", 1), ManifestOfSnapshot("snap")}; !slices.Equal(q.jobs, want) {
		t.Fatalf("after removing killed: %v, want %v", q.jobs, want)
	}
	node.held["kept"] = true
	r.CancelOrphanUploads()
	if want := []string{ManifestOfPause("kept", 1), ManifestOfSnapshot("snap")}; !slices.Equal(q.jobs, want) {
		t.Fatalf("after the sweep: %v, want %v", q.jobs, want)
	}
}
