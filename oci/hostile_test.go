package oci

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	lt "github.com/agentenv/agentenv/oci/internal/layertest"
	"github.com/agentenv/agentenv/oci/unpack"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/klauspost/compress/gzip"
	"golang.org/x/sys/unix"
)

// injectInto applies one layer to a fresh root and runs Inject on it, with
// inotify watching the given special files: it returns Inject's error and
// whether any of them was opened. An Inject that blocks (reading a FIFO
// with no writer) fails the test after 10 s.
func injectInto(t *testing.T, layer []lt.Entry, watch ...string) (error, bool) {
	t.Helper()
	root, err := unpack.OpenRoot(filepath.Join(t.TempDir(), "tree"))
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	if _, err := root.Apply(context.Background(), bytes.NewReader(lt.Tar(layer))); err != nil {
		t.Fatal(err)
	}
	in, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(in)
	for _, p := range watch {
		if _, err := unix.InotifyAddWatch(in, filepath.Join(root.Path(), p), unix.IN_OPEN); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- Inject(root, ConvertOptions{}) }()
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		t.Errorf("Inject blocked on a special file of the image")
		for _, p := range watch { // a writer lets a blocked FIFO reader go
			if fd, err := unix.Open(filepath.Join(root.Path(), p), unix.O_WRONLY|unix.O_NONBLOCK, 0); err == nil {
				unix.Close(fd)
			}
		}
		err = <-done
	}
	n, _ := unix.Read(in, make([]byte, 4096))
	return err, n > 0
}

// TestInjectNeverOpensSpecialFiles: a FIFO or a device node where Inject
// reads the image's user databases (or looks for bash) is never opened;
// the conversion fails cleanly instead of blocking every build of the node
// or having root open a host device.
func TestInjectNeverOpensSpecialFiles(t *testing.T) {
	base := []lt.Entry{lt.Dir("etc", 0o755), lt.Dir("dev", 0o755), lt.Dir("bin", 0o755)}
	for _, tc := range []struct {
		name  string
		layer []lt.Entry
		watch []string
	}{
		{"fifo passwd", []lt.Entry{lt.Fifo("etc/passwd")}, []string{"etc/passwd"}},
		{"device group", []lt.Entry{lt.Char("etc/group", 1, 5)}, []string{"etc/group"}},
		{"shadow links to a device", []lt.Entry{lt.Char("dev/zero", 1, 5), lt.Symlink("etc/shadow", "/dev/zero")}, []string{"dev/zero"}},
	} {
		err, opened := injectInto(t, append(base, tc.layer...), tc.watch...)
		if err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("%s: Inject: %v, want not a regular file", tc.name, err)
		}
		if opened {
			t.Errorf("%s: a special file of the image was opened", tc.name)
		}
	}
	// A FIFO at /bin/bash is not bash: the user gets /bin/sh, and the FIFO
	// is not opened.
	err, opened := injectInto(t, append(base, lt.Fifo("bin/bash")), "bin/bash")
	if err != nil || opened {
		t.Errorf("FIFO at /bin/bash: Inject: %v, opened %v", err, opened)
	}
}

// TestBuildTreeLimits: the image limits reach the root Convert unpacks
// into, for entries of every kind: symbolic links with long targets go past
// the byte bound of a 1 MiB filesystem though no file has content.
func TestBuildTreeLimits(t *testing.T) {
	var layer []lt.Entry
	for i := range 3000 {
		layer = append(layer, lt.Symlink(fmt.Sprintf("%s%d", strings.Repeat("s", 200), i), "/"+strings.Repeat("t", 1000)))
	}
	root, err := unpack.OpenRoot(filepath.Join(t.TempDir(), "tree"))
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	setLimits(root, ConvertOptions{SizeMiB: 1})
	_, err = root.Apply(context.Background(), bytes.NewReader(lt.Tar(layer)))
	if !errors.Is(err, unpack.ErrLimit) {
		t.Errorf("3000 symlinks of 1.2 KiB into a 1 MiB filesystem: %v, want a limit error", err)
	}
}

// TestTruncatedLayerIsAnError: a compressed layer cut short is an error,
// never a shorter stream that skips the diff ID check (a truncated tar can
// end on an entry boundary and unpack "cleanly").
func TestTruncatedLayerIsAnError(t *testing.T) {
	tarb := lt.Tar([]lt.Entry{lt.File("a", strings.Repeat("a", 100000), 0o644), lt.File("b", strings.Repeat("b", 100000), 0o644)})
	var gz bytes.Buffer
	gw := gzip.NewWriter(&gz)
	gw.Write(tarb)
	gw.Close()
	sum := sha256.Sum256(tarb)
	diffID := v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])}
	for _, cut := range []int{10, gz.Len() / 2, gz.Len() - 9} {
		p := filepath.Join(t.TempDir(), "blob")
		if err := os.WriteFile(p, gz.Bytes()[:cut], 0o600); err != nil {
			t.Fatal(err)
		}
		rc, err := Layer{Path: p, DiffID: diffID, Digest: diffID}.Open()
		if err != nil {
			continue
		}
		n, err := io.Copy(io.Discard, rc)
		rc.Close()
		if err == nil {
			t.Errorf("a gzip layer cut at %d of %d bytes read as a complete stream of %d bytes", cut, gz.Len(), n)
		}
	}
}
