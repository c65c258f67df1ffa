package dockerfile

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// tree writes files (name → content; a name ending in / is a directory;
// content "->target" makes a symbolic link) under a new directory.
func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if strings.HasSuffix(name, "/") {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if target, ok := strings.CutPrefix(content, "->"); ok {
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// entries lists a tar's entries as "name type [content|target]".
func entries(t *testing.T, b []byte) []string {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(b))
	var out []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(time.Unix(0, 0)) || h.Uid != 0 || h.Gid != 0 || h.Uname != "" {
			t.Fatalf("entry %s not normalized: %+v", h.Name, h)
		}
		e := h.Name
		switch h.Typeflag {
		case tar.TypeReg:
			c, _ := io.ReadAll(tr)
			e += " f " + string(c)
		case tar.TypeSymlink:
			e += " l " + h.Linkname
		case tar.TypeDir:
			e += " d"
		}
		out = append(out, e)
	}
}

func pack(t *testing.T, dir, src string, add bool) ([]byte, error) {
	t.Helper()
	c, err := OpenContext(dir)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	_, err = c.WriteTar(&b, src, add)
	return b.Bytes(), err
}

func TestWriteTar(t *testing.T) {
	t.Parallel()
	dir := tree(t, map[string]string{
		"a.txt": "A", "b.txt": "B", "c.go": "C",
		"src/main.go": "main", "src/lib/x.go": "x", "src/link": "->lib/x.go",
		"node_modules/junk": "j", "logs/keep.log": "k", "logs/drop.log": "d",
		".dockerignore": "node_modules\nlogs/*.log\n!logs/keep.log\n**/*.tmp\n", "src/lib/y.tmp": "tmp",
		"empty/": "",
	})
	tests := []struct {
		src  string
		want []string
	}{
		{"a.txt", []string{"a.txt f A"}},
		{"/a.txt", []string{"a.txt f A"}},
		{"*.txt", []string{"a.txt f A", "b.txt f B"}},
		{"src", []string{"src/ d", "src/lib/ d", "src/lib/x.go f x", "src/link l lib/x.go", "src/main.go f main"}},
		{"src/lib/x.go", []string{"src/ d", "src/lib/ d", "src/lib/x.go f x"}},
		{"src/*/x.go", []string{"src/ d", "src/lib/ d", "src/lib/x.go f x"}},
		{"logs", []string{"logs/ d", "logs/keep.log f k"}},
		{"empty", []string{"empty/ d"}},
		{".", []string{".dockerignore f node_modules\nlogs/*.log\n!logs/keep.log\n**/*.tmp\n", "a.txt f A", "b.txt f B", "c.go f C",
			"empty/ d", "logs/ d", "logs/keep.log f k", "src/ d", "src/lib/ d", "src/lib/x.go f x", "src/link l lib/x.go", "src/main.go f main"}},
	}
	for _, tt := range tests {
		b, err := pack(t, dir, tt.src, false)
		if err != nil {
			t.Fatalf("pack %s: %v", tt.src, err)
		}
		if got := entries(t, b); !slices.Equal(got, tt.want) {
			t.Errorf("pack %s:\n got %q\nwant %q", tt.src, got, tt.want)
		}
	}
	for _, src := range []string{"nope", "node_modules", "node_modules/junk", "*.none"} {
		if _, err := pack(t, dir, src, false); err == nil || !strings.Contains(err.Error(), "no such file in the build context") {
			t.Errorf("pack %s: %v, want not found", src, err)
		}
	}
}

// TestPackDeterministic: the same files give the same hash whatever their
// times and owners; a changed byte or mode changes it.
func TestPackDeterministic(t *testing.T) {
	t.Parallel()
	files := map[string]string{"d/a": "1", "d/b/c": "2", "d/l": "->a"}
	d1, d2 := tree(t, files), tree(t, files)
	old := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := os.Chtimes(filepath.Join(d2, "d/a"), old, old); err != nil {
		t.Fatal(err)
	}
	hash := func(dir string) string {
		c, err := OpenContext(dir)
		if err != nil {
			t.Fatal(err)
		}
		a, err := c.Pack(Step{Type: "COPY", Args: []string{"d", "/x/", "", ""}}, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(a.Path)
		if int64(len(b)) != a.Size || a.Files != 5 {
			t.Fatalf("archive %+v, file has %d bytes", a, len(b))
		}
		return a.Hash
	}
	h1 := hash(d1)
	if h2 := hash(d2); h1 != h2 {
		t.Fatalf("same files, different hashes: %s %s", h1, h2)
	}
	os.Chmod(filepath.Join(d2, "d/a"), 0o755)
	if h2 := hash(d2); h1 == h2 {
		t.Fatal("mode change did not change the hash")
	}
	os.WriteFile(filepath.Join(d1, "d/b/c"), []byte("3"), 0o644)
	if h := hash(d1); h == h1 {
		t.Fatal("content change did not change the hash")
	}
}

func TestWriteTarRefusesEscapes(t *testing.T) {
	t.Parallel()
	outside := tree(t, map[string]string{"secret": "s"})
	dir := tree(t, map[string]string{
		"ok":  "fine",
		"abs": "->" + filepath.Join(outside, "secret"), "absdir": "->" + outside,
		"rel":     "->../../../../../../../../etc/passwd",
		"d/inner": "->/etc/passwd", "d/up": "->../ok",
	})
	tests := []struct{ src, want string }{
		{"abs", "outside the build context"},
		{"absdir", "outside the build context"},
		{"absdir/secret", "outside the build context"},
		{"rel", "outside the build context"},
		{"d", `COPY source "d/inner": symbolic link to /etc/passwd points outside the build context`},
		{".", "outside the build context"},
	}
	for _, tt := range tests {
		if _, err := pack(t, dir, tt.src, false); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("pack %s: %v, want %q", tt.src, err, tt.want)
		}
	}
	// A link named as the source is followed (as Docker does) when it stays
	// inside the context.
	if b, err := pack(t, dir, "d/up", false); err != nil || !slices.Equal(entries(t, b), []string{"d/ d", "d/up f fine"}) {
		t.Errorf("a link inside the context: %v %q", err, entries(t, b))
	}
}

func TestAddRefusesArchives(t *testing.T) {
	t.Parallel()
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write([]byte("x"))
	zw.Close()
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	tw.WriteHeader(&tar.Header{Name: "f", Mode: 0o644, Typeflag: tar.TypeReg})
	tw.Close()
	dir := tree(t, map[string]string{"a.tgz": gz.String(), "a.tar": tb.String(), "plain": "text"})
	for src, kind := range map[string]string{"a.tgz": "gzip", "a.tar": "tar"} {
		if _, err := pack(t, dir, src, true); err == nil || !strings.Contains(err.Error(), "a "+kind+" archive") {
			t.Errorf("ADD %s: %v", src, err)
		}
		if _, err := pack(t, dir, src, false); err != nil {
			t.Errorf("COPY of an archive must work: %v", err)
		}
	}
	if _, err := pack(t, dir, "plain", true); err != nil {
		t.Errorf("ADD of a plain file: %v", err)
	}
}

func TestIgnore(t *testing.T) {
	t.Parallel()
	ig := ParseIgnore("# comment\n*.md\n!README.md\n/build\ndocs/**/*.png\n[ab].c\n")
	for p, want := range map[string]bool{
		"x.md": true, "README.md": false, "sub/x.md": false, "build": true, "build/x": true, "src/build": false,
		"docs/a.png": true, "docs/x/y/a.png": true, "a.png": false, "a.c": true, "c.c": false,
	} {
		if got := ig.Excluded(p); got != want {
			t.Errorf("Excluded(%s) = %v, want %v", p, got, want)
		}
	}
}
