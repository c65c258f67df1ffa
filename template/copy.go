package template

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/agentenv/agentenv/guest/agent/agentclient"
	pb "github.com/agentenv/agentenv/guest/agent/gen/process"
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

// copy runs a COPY/ADD step: args [src, dest, user?, mode?].
func (v *buildVM) copy(ctx context.Context, step string, st BuildStep) error {
	src, err := cleanRel(st.Args[0])
	if err != nil {
		return fmt.Errorf("COPY: %w", err)
	}
	dest := st.Args[1]
	plan := copyPlan{src: src, dest: v.abs(dest), destDir: strings.HasSuffix(dest, "/") || dest == "." || dest == "", mode: -1}
	owner := v.user
	if len(st.Args) > 2 && st.Args[2] != "" {
		owner = st.Args[2]
	}
	if len(st.Args) > 3 && st.Args[3] != "" {
		m, err := strconv.ParseInt(st.Args[3], 8, 32)
		if err != nil || m < 0 || m > 0o7777 {
			return fmt.Errorf("COPY: mode %q: want octal like 0644", st.Args[3])
		}
		plan.mode = m
	}
	if plan.uid, plan.gid, err = v.ids(ctx, step, owner); err != nil {
		return err
	}
	archive := v.b.filesPath(st.FilesHash)
	open := func() (io.ReadCloser, error) { return os.Open(archive) }
	tmp, err := os.CreateTemp(filepath.Dir(archive), ".copy-*")
	if err != nil {
		return fmt.Errorf("COPY: %w", err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	n, err := copyArchive(open, plan, tmp)
	if err != nil {
		return fmt.Errorf("COPY: %w", err)
	}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("COPY: %w", err)
	}
	guestPath := fmt.Sprintf("/tmp/.aenv-copy-%s-%s.tar", v.bid, step)
	if err := v.upload(ctx, guestPath, tmp); err != nil {
		return fmt.Errorf("COPY: upload to the build VM: %w", err)
	}
	script := `tar -xf "$1" -C / ; rc=$?; rm -f "$1"; exit $rc`
	if err := v.run(ctx, step, "root", "/bin/sh", []string{"-c", script, "sh", guestPath}, "/"); err != nil {
		return fmt.Errorf("COPY: extract in the build VM (the image needs tar): %w", err)
	}
	v.logf("info", step, "copied %d entries to %s (owner %s)", n, plan.dest, owner)
	return nil
}

// ids returns a user's uid and primary gid in the build VM.
func (v *buildVM) ids(ctx context.Context, step, user string) (int, int, error) {
	if user == "root" || user == "0" {
		return 0, 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var out strings.Builder
	client := agentclient.NewProcessClient(v.hc, agentURL)
	stdinOff := false
	cwd := "/"
	req := connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", `id -u "$1"; id -g "$1"`, "sh", user}, Cwd: &cwd}, Stdin: &stdinOff})
	req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("root:")))
	stream, err := client.Start(ctx, req)
	if err != nil {
		return 0, 0, fmt.Errorf("look up user %s: %w", user, err)
	}
	defer stream.Close()
	code := -1
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			out.Write(d.GetStdout())
		}
		if end := ev.GetEnd(); end != nil {
			code = int(end.GetExitCode())
		}
	}
	f := strings.Fields(out.String())
	if code != 0 || len(f) != 2 {
		return 0, 0, fmt.Errorf("user %s does not exist in the image", user)
	}
	uid, err1 := strconv.Atoi(f[0])
	gid, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("user %s: id printed %q", user, out.String())
	}
	return uid, gid, nil
}

// upload writes r to guestPath (as root) through the agent's /files.
func (v *buildVM) upload(ctx context.Context, guestPath string, r io.Reader) error {
	return agentclient.Upload(ctx, agentURL, v.hc, "", "root", guestPath, r)
}
