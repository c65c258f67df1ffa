// Package composeup starts a validated Compose project (package compose) in
// a running sandbox of the compose-v1 template (package composeguest). The
// node pulls the project's images through its own registry configuration
// into one Docker archive (oci.PullArchive), so the guest needs no registry
// access; the archive and the checked file go to the guest through its
// agent, which loads the images and runs docker-compose up.
package composeup

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"
)

// Guest is a running sandbox's guest as root: files written and commands
// run through its agent (sandbox.Guest).
type Guest interface {
	Upload(ctx context.Context, path string, r io.Reader) error
	Run(ctx context.Context, argv ...string) (stdout, stderr []byte, code int, err error)
}

// Puller writes images as one Docker archive (oci.Puller).
type Puller interface {
	PullArchive(ctx context.Context, w io.Writer, refs []string) error
}

// Where the project lives in the guest, and its name there: one project
// per sandbox, so a fixed name (a fork's child runs the same project).
const (
	GuestDir    = "/var/lib/aenv-compose"
	ProjectName = "project"
)

// Starter pulls and starts projects.
type Starter struct {
	Puller Puller
	// TempDir holds archives between their pull and their hand-over.
	TempDir string
	Log     *slog.Logger
}

// Archive is a project's images pulled into one file, to Close once
// handed in.
type Archive struct {
	Images []string
	path   string
	size   int64
}

// Close removes the archive's file.
func (a *Archive) Close() error { return os.Remove(a.path) }

// Pull pulls images into an archive file: done before any VM starts, so an
// image the node cannot pull refuses the project with nothing to undo.
func (s *Starter) Pull(ctx context.Context, images []string) (*Archive, error) {
	start := time.Now()
	f, err := os.CreateTemp(s.TempDir, "compose-images-*.tar")
	if err != nil {
		return nil, fmt.Errorf("compose images: %w", err)
	}
	a := &Archive{Images: images, path: f.Name()}
	err = s.Puller.PullArchive(ctx, f, images)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = a.Close()
		return nil, fmt.Errorf("pull the compose project's images %s: %w", strings.Join(images, ", "), err)
	}
	if st, err := os.Stat(a.path); err == nil {
		a.size = st.Size()
	}
	s.log().Info("compose images pulled", "images", images, "bytes", a.size, "took", time.Since(start).Round(time.Millisecond))
	return a, nil
}

// loadScript loads the images and drops their archive.
const loadScript = `set -e
cd "$1"
docker load -q -i images.tar
rm -f images.tar
`

// upScript starts every service in the background of the guest
// (--no-build: the file has no builds; every image is loaded, so nothing
// is pulled).
const upScript = `cd "$1" && exec docker-compose --ansi never -p "$2" -f compose.json up -d --no-build`

// Up hands the archive and the project's checked file (compose.Project's
// File) to g and starts the project there; an error carries the tail of
// what the guest's commands printed.
func (s *Starter) Up(ctx context.Context, g Guest, a *Archive, file []byte) error {
	start := time.Now()
	f, err := os.Open(a.path)
	if err != nil {
		return fmt.Errorf("compose images: %w", err)
	}
	defer f.Close()
	if err := g.Upload(ctx, GuestDir+"/images.tar", f); err != nil {
		return fmt.Errorf("hand the images to the guest: %w", err)
	}
	if err := g.Upload(ctx, GuestDir+"/compose.json", strings.NewReader(string(file))); err != nil {
		return fmt.Errorf("hand the compose file to the guest: %w", err)
	}
	handed := time.Now()
	if err := run(ctx, g, "load the compose project's images", "/bin/sh", "-c", loadScript, "compose-load", GuestDir); err != nil {
		return err
	}
	loaded := time.Now()
	if err := run(ctx, g, "start the compose project", "/bin/sh", "-c", upScript, "compose-up", GuestDir, ProjectName); err != nil {
		return err
	}
	s.log().Info("compose project started", "images", a.Images, "handed_in", handed.Sub(start).Round(time.Millisecond),
		"loaded", loaded.Sub(handed).Round(time.Millisecond), "up", time.Since(loaded).Round(time.Millisecond))
	return nil
}

// run runs argv in g; a failure, or a non-zero exit with the tail of what
// it printed, is an error naming what (the step).
func run(ctx context.Context, g Guest, what string, argv ...string) error {
	out, errOut, code, err := g.Run(ctx, argv...)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if code != 0 {
		return fmt.Errorf("%s: exit %d: %s", what, code, tail(errOut, out))
	}
	return nil
}

func (s *Starter) log() *slog.Logger {
	if s.Log == nil {
		return slog.Default()
	}
	return s.Log
}

// tail is the end of a command's output, stderr first, for an error.
func tail(stderr, stdout []byte) string {
	b := strings.TrimSpace(string(stderr))
	if b == "" {
		b = strings.TrimSpace(string(stdout))
	}
	if len(b) > 2000 {
		b = "…" + b[len(b)-2000:]
	}
	return b
}
