package composeup

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
)

// archivePuller writes data as the archive, or fails with err after
// writing part of it.
type archivePuller struct {
	data []byte
	err  error
}

func (p archivePuller) PullArchive(_ context.Context, w io.Writer, _ []string) error {
	if p.err != nil {
		_, _ = w.Write(p.data[:len(p.data)/2])
		return p.err
	}
	_, err := w.Write(p.data)
	return err
}

// recordingGuest is a guest that records what it is given (a fake: the
// real guest is in cli/e2e's TestComposeUp); the commands whose script
// contains failOn exit 1 with stderr.
type recordingGuest struct {
	files  map[string][]byte
	ran    []string
	failOn string
	stderr string
}

func (g *recordingGuest) Upload(_ context.Context, path string, r io.Reader) error {
	b, err := io.ReadAll(r)
	if g.files == nil {
		g.files = map[string][]byte{}
	}
	g.files[path] = b
	return err
}

func (g *recordingGuest) Run(_ context.Context, argv ...string) ([]byte, []byte, int, error) {
	script := strings.Join(argv, " ")
	g.ran = append(g.ran, script)
	if g.failOn != "" && strings.Contains(script, g.failOn) {
		return []byte("some output\n"), []byte(g.stderr), 1, nil
	}
	return nil, nil, 0, nil
}

func TestUpHandsInAndStarts(t *testing.T) {
	dir := t.TempDir()
	data := bytes.Repeat([]byte("layer"), 100_000)
	s := &Starter{Puller: archivePuller{data: data}, TempDir: dir}
	a, err := s.Pull(context.Background(), []string{"web:1"})
	if err != nil {
		t.Fatal(err)
	}
	g := &recordingGuest{}
	file := []byte(`{"services":{}}`)
	if err := s.Up(context.Background(), g, a, file); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(g.files[GuestDir+"/images.tar"], data) || !bytes.Equal(g.files[GuestDir+"/compose.json"], file) {
		t.Fatalf("the guest got %d bytes of images and %q, want %d and %q",
			len(g.files[GuestDir+"/images.tar"]), g.files[GuestDir+"/compose.json"], len(data), file)
	}
	if len(g.ran) != 2 || !strings.Contains(g.ran[0], "docker load") || !strings.Contains(g.ran[1], "docker-compose") ||
		!strings.Contains(g.ran[1], ProjectName) {
		t.Fatalf("commands run: %q, want the load then the project's up", g.ran)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("archives left after Close: %v", left)
	}
}

// A failed pull leaves no archive behind; a failed step names itself and
// the guest's words, and stops what follows it.
func TestFailuresAreNamed(t *testing.T) {
	dir := t.TempDir()
	s := &Starter{Puller: archivePuller{data: []byte("partial archive"), err: errors.New("manifest unknown")}, TempDir: dir}
	if _, err := s.Pull(context.Background(), []string{"web:1", "db:2"}); err == nil ||
		!strings.Contains(err.Error(), "web:1, db:2") || !strings.Contains(err.Error(), "manifest unknown") {
		t.Fatalf("failed pull: %v", err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("a failed pull left %v", left)
	}

	s.Puller = archivePuller{data: []byte("archive")}
	a, err := s.Pull(context.Background(), []string{"web:1"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	g := &recordingGuest{failOn: "docker load", stderr: "open images.tar: no space left on device\n"}
	err = s.Up(context.Background(), g, a, []byte("{}"))
	if err == nil || !strings.Contains(err.Error(), "load the compose project's images: exit 1") ||
		!strings.Contains(err.Error(), "no space left on device") {
		t.Fatalf("failed load: %v", err)
	}
	if len(g.ran) != 1 {
		t.Fatalf("commands after a failed load: %q", g.ran)
	}
}

// tail keeps the end of long output, and falls back to stdout when stderr
// is empty.
func TestTail(t *testing.T) {
	long := strings.Repeat("x", 5000) + "the end"
	if got := tail([]byte(long), nil); len(got) > 2010 || !strings.HasSuffix(got, "the end") {
		t.Fatalf("tail of %d bytes: %d bytes ending %q", len(long), len(got), got[len(got)-10:])
	}
	if got := tail(nil, []byte(" only stdout \n")); got != "only stdout" {
		t.Fatalf("tail without stderr: %q", got)
	}
}
