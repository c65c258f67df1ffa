package orchestrator

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
)

// COPY/ADD steps: the client uploads a tar archive (plain or gzip) of the
// files, named by their paths relative to its build context. copyArchive
// selects the entries src names and rewrites them to their destination
// paths (relative to "/", owned by uid:gid, mode applied when set), so the
// guest only runs `tar -xf archive -C /` as root. The semantics follow
// Docker's COPY:
//
//   - src is a path or a glob pattern (path.Match) relative to the context;
//     "." is the whole context;
//   - a matched directory contributes its contents to dest;
//   - a matched file goes to dest/basename when dest ends with "/" or src
//     matches several entries, else to dest itself.
//
// Entries with absolute names or ".." components are refused; link
// targets are kept as they are (they resolve inside the guest's root).

// copyPlan is the destination of the selected entries.
type copyPlan struct {
	src     string // cleaned src pattern, "" for the whole context
	dest    string // absolute, cleaned
	destDir bool   // dest ended with "/"
	uid     int
	gid     int
	mode    int64 // -1: keep
}

// cleanRel cleans an archive or src path: relative, no "..", "" for the root.
func cleanRel(p string) (string, error) {
	q := path.Clean("/" + strings.TrimPrefix(p, "./"))
	if strings.HasPrefix(p, "/") || slicesContains(strings.Split(p, "/"), "..") {
		return "", fmt.Errorf("path %q leaves the build context", p)
	}
	return strings.TrimPrefix(q, "/"), nil
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// matchRoot returns the first len(pattern components) components of name
// when they match the pattern, and the rest.
func matchRoot(pattern, name string) (root, rest string, ok bool) {
	if pattern == "" {
		return "", name, true
	}
	pc := strings.Split(pattern, "/")
	nc := strings.Split(name, "/")
	if len(nc) < len(pc) {
		return "", "", false
	}
	for i, p := range pc {
		if m, err := path.Match(p, nc[i]); err != nil || !m {
			return "", "", false
		}
	}
	return strings.Join(nc[:len(pc)], "/"), strings.Join(nc[len(pc):], "/"), true
}

// openArchive returns the tar stream of a plain or gzip-compressed archive.
func openArchive(r io.Reader) (*tar.Reader, error) {
	br := bufio.NewReader(r)
	magic, _ := br.Peek(2)
	if bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		return tar.NewReader(gz), nil
	}
	return tar.NewReader(br), nil
}

// copyArchive reads the uploaded archive twice (scan: which roots match and
// whether each is a directory; then rewrite) and writes the destination
// tar to w. It returns how many entries it wrote.
func copyArchive(open func() (io.ReadCloser, error), plan copyPlan, w io.Writer) (int, error) {
	roots, err := scanRoots(open, plan.src)
	if err != nil {
		return 0, err
	}
	if len(roots) == 0 {
		return 0, fmt.Errorf("COPY %s: no file in the uploaded archive matches", displaySrc(plan.src))
	}
	rc, err := open()
	if err != nil {
		return 0, err
	}
	defer rc.Close()
	tr, err := openArchive(rc)
	if err != nil {
		return 0, err
	}
	tw := tar.NewWriter(w)
	n := 0
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return n, fmt.Errorf("read archive: %w", err)
		}
		name, err := cleanRel(h.Name)
		if err != nil || name == "" {
			continue // checked by scanRoots; "" is the context root itself
		}
		root, rest, ok := matchRoot(plan.src, name)
		if !ok {
			continue
		}
		target := plan.target(root, rest, roots)
		if target == "" || target == "/" {
			continue // never re-own or re-mode the guest's root directory
		}
		out := &tar.Header{Name: strings.TrimPrefix(target, "/"), Typeflag: h.Typeflag, Mode: h.Mode & 0o7777,
			Uid: plan.uid, Gid: plan.gid, ModTime: h.ModTime, Linkname: h.Linkname, Size: h.Size,
			Devmajor: h.Devmajor, Devminor: h.Devminor, Format: tar.FormatPAX}
		switch h.Typeflag {
		case tar.TypeReg, tar.TypeDir, tar.TypeSymlink:
		case tar.TypeLink:
			// A hard link names another entry: rewrite it the same way, or
			// copy nothing when its target was not selected.
			lname, err := cleanRel(h.Linkname)
			if err != nil {
				return n, fmt.Errorf("archive entry %q: link %w", h.Name, err)
			}
			lroot, lrest, ok := matchRoot(plan.src, lname)
			if !ok {
				return n, fmt.Errorf("archive entry %q: hard link to %q outside the copied files", h.Name, h.Linkname)
			}
			out.Linkname = strings.TrimPrefix(plan.target(lroot, lrest, roots), "/")
		default:
			continue // devices, fifos: not copied
		}
		if plan.mode >= 0 && h.Typeflag != tar.TypeSymlink && h.Typeflag != tar.TypeLink {
			out.Mode = plan.mode
		}
		if h.Typeflag == tar.TypeDir {
			out.Name += "/"
		}
		if err := tw.WriteHeader(out); err != nil {
			return n, fmt.Errorf("write archive: %w", err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := io.Copy(tw, tr); err != nil {
				return n, fmt.Errorf("copy %s: %w", h.Name, err)
			}
		}
		n++
	}
	return n, tw.Close()
}

// target is where an entry (matched root + rest) goes; "" skips it.
func (p copyPlan) target(root, rest string, roots map[string]bool) string {
	isDir := roots[root]
	switch {
	case isDir && rest == "":
		return p.dest // the matched directory itself is dest
	case isDir:
		return path.Join(p.dest, rest)
	case p.destDir || len(roots) > 1:
		return path.Join(p.dest, path.Base(root), rest)
	default:
		return path.Join(p.dest, rest)
	}
}

// scanRoots lists the matched roots: root -> is a directory. It refuses
// archives with escaping names.
func scanRoots(open func() (io.ReadCloser, error), src string) (map[string]bool, error) {
	rc, err := open()
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	tr, err := openArchive(rc)
	if err != nil {
		return nil, err
	}
	roots := map[string]bool{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return roots, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read archive: %w", err)
		}
		name, err := cleanRel(h.Name)
		if err != nil {
			return nil, fmt.Errorf("archive entry: %w", err)
		}
		root, rest, ok := matchRoot(src, name)
		if !ok || name == "" && src != "" {
			continue
		}
		if rest != "" || h.Typeflag == tar.TypeDir || src == "" {
			roots[root] = true
		} else if _, seen := roots[root]; !seen {
			roots[root] = false
		}
	}
}

func displaySrc(s string) string {
	if s == "" {
		return "."
	}
	return s
}
