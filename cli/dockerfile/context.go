package dockerfile

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// Archive is the packed sources of one COPY step: a tar archive whose
// entries are the sources' paths relative to the build context (as E2B's
// uploads), with fixed times and owners so that the same files always give
// the same bytes, hence the same hash.
type Archive struct {
	Hash  string // SHA-256 of the tar, hex
	Path  string // file holding the tar
	Size  int64
	Files int // entries (files, directories, links)
}

// Context is a build context directory with its .dockerignore.
type Context struct {
	root   string // absolute, symlinks resolved
	ignore *Ignore
}

// OpenContext opens a build context directory and reads its .dockerignore.
func OpenContext(dir string) (*Context, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("open build context %s: %w", dir, err)
	}
	root, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, fmt.Errorf("open build context %s: %w", dir, err)
	}
	if fi, err := os.Stat(root); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("open build context %s: not a directory", dir)
	}
	c := &Context{root: root, ignore: &Ignore{}}
	b, err := os.ReadFile(filepath.Join(root, ".dockerignore"))
	switch {
	case err == nil:
		c.ignore = ParseIgnore(string(b))
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("read %s: %w", filepath.Join(dir, ".dockerignore"), err)
	}
	return c, nil
}

// Pack writes the sources of a COPY step into a tar file in tmpDir.
func (c *Context) Pack(step Step, tmpDir string) (Archive, error) {
	if step.Type != "COPY" || len(step.Args) == 0 {
		return Archive{}, fmt.Errorf("pack step %s: not a COPY step", step.Type)
	}
	f, err := os.CreateTemp(tmpDir, "aenv-copy-*.tar")
	if err != nil {
		return Archive{}, fmt.Errorf("pack %s: %w", step.Args[0], err)
	}
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(f, h)}
	n, err := c.WriteTar(cw, step.Args[0], step.Add)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return Archive{}, err
	}
	return Archive{Hash: hex.EncodeToString(h.Sum(nil)), Path: f.Name(), Size: cw.n, Files: n}, nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// WriteTar writes the files a COPY source (a context-relative path or glob
// pattern) names into w as a deterministic tar, and returns the number of
// entries. Sources escaping the context, symbolic links pointing out of it
// and (for ADD) archives are refused.
func (c *Context) WriteTar(w io.Writer, src string, add bool) (int, error) {
	matches, err := c.glob(src)
	if err != nil {
		return 0, err
	}
	if len(matches) == 0 {
		return 0, fmt.Errorf("COPY source %q: no such file in the build context %s", src, c.root)
	}
	tw := &tarWriter{tw: tar.NewWriter(w), c: c, seen: map[string]bool{}}
	for _, m := range matches {
		if err := tw.source(m, add); err != nil {
			return 0, err
		}
	}
	if err := tw.tw.Close(); err != nil {
		return 0, fmt.Errorf("COPY source %q: %w", src, err)
	}
	return tw.n, nil
}

// glob expands a context-relative pattern segment by segment (filepath.Match
// syntax per segment, as Docker), skipping ignored paths.
func (c *Context) glob(pattern string) ([]string, error) {
	if pattern == "." || pattern == "" {
		return []string{"."}, nil
	}
	cur := []string{"."}
	for _, seg := range strings.Split(pattern, "/") {
		if seg == "" || seg == "." {
			continue
		}
		if _, err := path.Match(seg, ""); err != nil {
			return nil, fmt.Errorf("COPY source %q: bad pattern: %w", pattern, err)
		}
		var next []string
		for _, dir := range cur {
			if !strings.ContainsAny(seg, `*?[\`) {
				p := path.Join(dir, seg)
				if _, err := os.Lstat(filepath.Join(c.root, filepath.FromSlash(p))); err == nil {
					next = append(next, p)
				}
				continue
			}
			real, err := c.resolve(dir)
			if err != nil {
				return nil, err
			}
			ents, err := os.ReadDir(real)
			if err != nil {
				continue // not a directory: no match below it
			}
			for _, e := range ents {
				if ok, _ := path.Match(seg, e.Name()); ok {
					p := path.Join(dir, e.Name())
					if !c.ignore.Excluded(p) {
						next = append(next, p)
					}
				}
			}
		}
		cur = next
	}
	// A source the .dockerignore excludes is not part of the context.
	var out []string
	for _, p := range cur {
		if p == "." || !c.ignore.Excluded(p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// resolve returns the real path of a context-relative path, refusing one
// that leads (through symbolic links) out of the context.
func (c *Context) resolve(rel string) (string, error) {
	real, err := filepath.EvalSymlinks(filepath.Join(c.root, filepath.FromSlash(rel)))
	if err != nil {
		return "", fmt.Errorf("COPY source %q: %w", rel, err)
	}
	if !c.inside(real) {
		return "", fmt.Errorf("COPY source %q resolves to %s, outside the build context %s", rel, real, c.root)
	}
	return real, nil
}

func (c *Context) inside(p string) bool {
	r, err := filepath.Rel(c.root, p)
	return err == nil && r != ".." && !strings.HasPrefix(r, ".."+string(filepath.Separator)) && !filepath.IsAbs(r)
}

type tarWriter struct {
	tw   *tar.Writer
	c    *Context
	seen map[string]bool
	n    int
}

// epoch is every entry's modification time: the hash must depend on the
// files' contents and modes only.
var epoch = time.Unix(0, 0)

func (t *tarWriter) source(rel string, add bool) error {
	real, err := t.c.resolve(rel)
	if err != nil {
		return err
	}
	fi, err := os.Stat(real)
	if err != nil {
		return fmt.Errorf("COPY source %q: %w", rel, err)
	}
	if err := t.parents(rel); err != nil {
		return err
	}
	if !fi.IsDir() {
		if add && fi.Mode().IsRegular() {
			if kind := archiveKind(real); kind != "" {
				return fmt.Errorf("ADD %s: a %s archive; aenv does not extract archives: COPY it and unpack it in a RUN step", rel, kind)
			}
		}
		if rel == "." {
			return fmt.Errorf("COPY source . is not a directory")
		}
		return t.entry(rel, real, fi)
	}
	return filepath.WalkDir(real, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("COPY source %q: %w", rel, err)
		}
		sub, _ := filepath.Rel(real, p)
		name := path.Join(rel, filepath.ToSlash(sub))
		if name == "." {
			return nil
		}
		if p != real && t.c.ignore.Excluded(name) {
			if d.IsDir() && !t.c.ignore.HasExceptions() {
				return filepath.SkipDir
			}
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return fmt.Errorf("COPY source %q: %w", name, err)
		}
		return t.entry(name, p, fi)
	})
}

// parents adds the directories above rel, so that extraction does not rely
// on implicit directories.
func (t *tarWriter) parents(rel string) error {
	dir := path.Dir(rel)
	if dir == "." || t.seen[dir] {
		return nil
	}
	if err := t.parents(dir); err != nil {
		return err
	}
	real, err := t.c.resolve(dir)
	if err != nil {
		return err
	}
	fi, err := os.Stat(real)
	if err != nil {
		return fmt.Errorf("COPY source %q: %w", dir, err)
	}
	return t.entry(dir, real, fi)
}

func (t *tarWriter) entry(name, real string, fi fs.FileInfo) error {
	if t.seen[name] {
		return nil
	}
	t.seen[name] = true
	hdr := &tar.Header{Name: name, Mode: int64(fi.Mode().Perm()), ModTime: epoch, Format: tar.FormatPAX}
	if fi.Mode()&fs.ModeSetuid != 0 {
		hdr.Mode |= 0o4000
	}
	if fi.Mode()&fs.ModeSetgid != 0 {
		hdr.Mode |= 0o2000
	}
	if fi.Mode()&fs.ModeSticky != 0 {
		hdr.Mode |= 0o1000
	}
	switch {
	case fi.IsDir():
		hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
	case fi.Mode().IsRegular():
		hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
	case fi.Mode()&fs.ModeSymlink != 0:
		target, err := os.Readlink(real)
		if err != nil {
			return fmt.Errorf("COPY source %q: %w", name, err)
		}
		abs := target
		if !filepath.IsAbs(target) {
			abs = filepath.Join(filepath.Dir(real), target)
		}
		if !t.c.inside(abs) {
			return fmt.Errorf("COPY source %q: symbolic link to %s points outside the build context %s", name, target, t.c.root)
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
	default:
		return fmt.Errorf("COPY source %q: %s files cannot be copied", name, fi.Mode().Type())
	}
	if err := t.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("COPY source %q: %w", name, err)
	}
	t.n++
	if hdr.Typeflag != tar.TypeReg {
		return nil
	}
	f, err := os.Open(real)
	if err != nil {
		return fmt.Errorf("COPY source %q: %w", name, err)
	}
	defer f.Close()
	if _, err := io.CopyN(t.tw, f, fi.Size()); err != nil {
		return fmt.Errorf("COPY source %q (changed while packing?): %w", name, err)
	}
	return nil
}

// archiveKind names the archive format of a file by its magic bytes ("" for
// none): Docker's ADD would extract these.
func archiveKind(p string) string {
	f, err := os.Open(p)
	if err != nil {
		return ""
	}
	defer f.Close()
	b := make([]byte, 512)
	n, _ := io.ReadFull(f, b)
	b = b[:n]
	switch {
	case bytes.HasPrefix(b, []byte{0x1f, 0x8b}):
		return "gzip"
	case bytes.HasPrefix(b, []byte("BZh")):
		return "bzip2"
	case bytes.HasPrefix(b, []byte{0xfd, '7', 'z', 'X', 'Z', 0}):
		return "xz"
	case bytes.HasPrefix(b, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		return "zstd"
	case len(b) >= 262 && bytes.Equal(b[257:262], []byte("ustar")):
		return "tar"
	}
	return ""
}
