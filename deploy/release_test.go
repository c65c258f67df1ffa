package deploy

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReleaseStampsVersion runs `make release` for the three binaries that
// report their build identity, into a temporary directory, and checks the
// stamping (aenv version, aenv --version, aenvd --version, aenv-storaged
// --version), that the binaries are static, the tarball's contents and the
// SHA256SUMS file.
func TestReleaseStampsVersion(t *testing.T) {
	requireTool(t, "make", "apt-get install make")
	repo := repoRoot(t)
	dist := t.TempDir()
	const (
		version = "v0.0.0-test.1"
		commit  = "0123456789abcdef0123456789abcdef01234567"
		date    = "2026-01-02T03:04:05Z"
	)
	run(t, repo, nil, "make", "--no-print-directory", "release", "RELEASE_DIR="+dist, "VERSION="+version,
		"COMMIT="+commit, "DATE="+date, "RELEASE_PKGS=./cmd/aenv ./cmd/aenvd ./cmd/aenv-storaged")
	rel := filepath.Join(dist, version)
	name := "aenv-" + version + "-linux-amd64"
	bin := filepath.Join(rel, name)

	want := version + " (commit " + commit + ", built " + date
	for _, c := range []struct {
		bin  string
		args []string
	}{
		{"aenv", []string{"version"}},
		{"aenv", []string{"--version"}},
		{"aenvd", []string{"--version"}},
		{"aenv-storaged", []string{"--version"}},
	} {
		out := strings.TrimSpace(run(t, "", nil, filepath.Join(bin, c.bin), c.args...))
		if !strings.HasPrefix(out, c.bin+" "+want) {
			t.Errorf("%s %v = %q, want prefix %q", c.bin, c.args, out, c.bin+" "+want)
		}
		if err := checkStatic(filepath.Join(bin, c.bin)); err != nil {
			t.Error(err)
		}
	}

	sums := readSums(t, filepath.Join(rel, "SHA256SUMS"))
	for _, f := range []string{name + ".tar.gz", name + "/aenvd", name + "/aenv", name + "/aenv-storaged", name + "/install.sh", name + "/systemd/aenvd.service.in"} {
		sum, ok := sums[f]
		if !ok {
			t.Errorf("SHA256SUMS has no line for %s", f)
			continue
		}
		h := sha256.Sum256(mustRead(t, filepath.Join(rel, f)))
		if got := hex.EncodeToString(h[:]); got != sum {
			t.Errorf("SHA256SUMS: %s is %s, the file hashes to %s", f, sum, got)
		}
	}

	entries := tarEntries(t, filepath.Join(rel, name+".tar.gz"))
	for _, f := range []string{name + "/aenvd", name + "/aenv", name + "/install.sh", name + "/systemd/aenv-storaged.service.in"} {
		e, ok := entries[f]
		if !ok {
			t.Errorf("the tarball lacks %s", f)
			continue
		}
		if e.Uid != 0 || e.Gid != 0 || e.ModTime.UTC().Format("2006-01-02T15:04:05Z") != date {
			t.Errorf("%s in the tarball: owner %d:%d, time %v; want 0:0 and the commit date (reproducible)", f, e.Uid, e.Gid, e.ModTime)
		}
	}
	if e := entries[name+"/aenvd"]; e != nil && e.Mode&0o111 == 0 {
		t.Errorf("aenvd in the tarball is not executable (%o)", e.Mode)
	}
}

// checkStatic fails for a dynamically linked executable.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New(path + " is dynamically linked")
		}
	}
	return nil
}

func readSums(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sums := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, file, ok := strings.Cut(sc.Text(), "  ")
		if !ok || len(sum) != 64 {
			t.Fatalf("SHA256SUMS: bad line %q", sc.Text())
		}
		sums[file] = sum
	}
	return sums
}

func tarEntries(t *testing.T, path string) map[string]*tar.Header {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	out := map[string]*tar.Header{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimSuffix(h.Name, "/")] = h
	}
}
