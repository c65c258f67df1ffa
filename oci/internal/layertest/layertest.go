// Package layertest builds tar layers for tests and keeps an independent
// model of what a stack of layers defines (overlay semantics with OCI
// whiteouts), to compare an unpacked or converted tree against, file by file.
package layertest

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Entry is one tar entry.
type Entry struct {
	Name    string
	Type    byte
	Mode    int64
	UID     int
	GID     int
	Data    string
	Link    string
	Major   int64
	Minor   int64
	Xattrs  map[string]string
	ModTime time.Time
}

var epoch = time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)

// File is a regular file.
func File(name, data string, mode int64) Entry {
	return Entry{Name: name, Type: tar.TypeReg, Mode: mode, Data: data, ModTime: epoch}
}

// Dir is a directory.
func Dir(name string, mode int64) Entry {
	return Entry{Name: name, Type: tar.TypeDir, Mode: mode, ModTime: epoch}
}

// Symlink is a symbolic link.
func Symlink(name, target string) Entry {
	return Entry{Name: name, Type: tar.TypeSymlink, Mode: 0o777, Link: target, ModTime: epoch}
}

// Hardlink is a hard link to target.
func Hardlink(name, target string) Entry {
	return Entry{Name: name, Type: tar.TypeLink, Link: target, ModTime: epoch}
}

// Char is a character device node.
func Char(name string, major, minor int64) Entry {
	return Entry{Name: name, Type: tar.TypeChar, Mode: 0o666, Major: major, Minor: minor, ModTime: epoch}
}

// Fifo is a named pipe.
func Fifo(name string) Entry {
	return Entry{Name: name, Type: tar.TypeFifo, Mode: 0o644, ModTime: epoch}
}

// Whiteout removes name from lower layers.
func Whiteout(name string) Entry {
	d, b := path.Split(name)
	return Entry{Name: d + ".wh." + b, Type: tar.TypeReg, Mode: 0o644, ModTime: epoch}
}

// Opaque hides the lower content of dir.
func Opaque(dir string) Entry {
	return Entry{Name: path.Join(dir, ".wh..wh..opq"), Type: tar.TypeReg, Mode: 0o644, ModTime: epoch}
}

// Tar writes entries as a PAX tar stream.
func Tar(entries []Entry) []byte {
	var buf bytes.Buffer
	w := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.Name, Typeflag: e.Type, Mode: e.Mode, Uid: e.UID, Gid: e.GID,
			Linkname: e.Link, Devmajor: e.Major, Devminor: e.Minor, ModTime: e.ModTime, Format: tar.FormatPAX}
		if e.Type == tar.TypeReg {
			h.Size = int64(len(e.Data))
		}
		for k, v := range e.Xattrs {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords["SCHILY.xattr."+k] = v
		}
		if err := w.WriteHeader(h); err != nil {
			panic(fmt.Sprintf("layertest: header %q: %v", e.Name, err))
		}
		if e.Type == tar.TypeReg {
			if _, err := w.Write([]byte(e.Data)); err != nil {
				panic(err)
			}
		}
	}
	if err := w.Close(); err != nil {
		panic(err)
	}
	return buf.Bytes()
}

// Node is one file in the model; hard links share a *Node.
type Node struct {
	Type    byte
	Mode    int64
	UID     int
	GID     int
	Data    string
	Link    string
	Major   int64
	Minor   int64
	Xattrs  map[string]string
	ModTime time.Time
}

// Model maps clean relative paths to nodes.
type Model map[string]*Node

func clean(name string) string {
	p := path.Clean("/" + name)
	if p == "/" {
		return "."
	}
	return p[1:]
}

func (m Model) removeTree(p string, keep map[string]bool) {
	for k := range m {
		if (k == p || strings.HasPrefix(k, p+"/")) && !keep[k] {
			delete(m, k)
		}
	}
}

// Apply applies one layer to the model (independently of package unpack).
func (m Model) Apply(entries []Entry) {
	seen := map[string]bool{}
	for _, e := range entries {
		p := clean(e.Name)
		dir, base := path.Split(p)
		dir = clean(dir)
		if base == ".wh..wh..opq" {
			for k := range m {
				if strings.HasPrefix(k, dir+"/") && !seen[k] {
					delete(m, k)
				}
			}
			continue
		}
		if t, ok := strings.CutPrefix(base, ".wh."); ok {
			if !seen[path.Join(dir, t)] {
				m.removeTree(path.Join(dir, t), seen)
			}
			continue
		}
		seen[p] = true
		for d := dir; d != "."; d = clean(path.Dir(d)) {
			seen[d] = true
			if m[d] == nil {
				m[d] = &Node{Type: tar.TypeDir, Mode: 0o755}
			}
		}
		if old := m[p]; old != nil && !(old.Type == tar.TypeDir && e.Type == tar.TypeDir) {
			m.removeTree(p, nil)
		}
		switch e.Type {
		case tar.TypeLink:
			m[p] = m[clean(e.Link)]
		default:
			m[p] = &Node{Type: e.Type, Mode: e.Mode & 0o7777, UID: e.UID, GID: e.GID, Data: e.Data, Link: e.Link,
				Major: e.Major, Minor: e.Minor, Xattrs: e.Xattrs, ModTime: e.ModTime}
		}
	}
}

// Compare checks (directory mtimes are not compared: a later layer adding an
// entry changes them, as it does in any overlay) that the tree at root holds exactly the model's entries
// (paths for which ignore returns true are skipped on both sides); it
// returns every difference found.
func Compare(root string, m Model, ignore func(string) bool) []string {
	var diffs []string
	actual := map[string]bool{}
	inodes := map[*Node]uint64{}
	_ = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			diffs = append(diffs, fmt.Sprintf("walk %s: %v", p, err))
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		if ignore != nil && ignore(rel) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		actual[rel] = true
		n := m[rel]
		if n == nil {
			diffs = append(diffs, fmt.Sprintf("%s: present but not defined by the layers", rel))
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			diffs = append(diffs, fmt.Sprintf("%s: lstat: %v", rel, err))
			return nil
		}
		if ino, ok := inodes[n]; ok && ino != st.Ino {
			diffs = append(diffs, fmt.Sprintf("%s: not a hard link of its link group (inode %d, want %d)", rel, st.Ino, ino))
		}
		inodes[n] = st.Ino
		wantFmt := map[byte]uint32{tar.TypeReg: unix.S_IFREG, tar.TypeDir: unix.S_IFDIR, tar.TypeSymlink: unix.S_IFLNK,
			tar.TypeChar: unix.S_IFCHR, tar.TypeBlock: unix.S_IFBLK, tar.TypeFifo: unix.S_IFIFO}[n.Type]
		if st.Mode&unix.S_IFMT != wantFmt {
			diffs = append(diffs, fmt.Sprintf("%s: type %o, want %o", rel, st.Mode&unix.S_IFMT, wantFmt))
			return nil
		}
		diffs = append(diffs, compareEntry(p, rel, n, &st)...)
		return nil
	})
	var missing []string
	for k := range m {
		if k != "." && !actual[k] && (ignore == nil || !ignore(k)) {
			missing = append(missing, k)
		}
	}
	sort.Strings(missing)
	for _, k := range missing {
		diffs = append(diffs, fmt.Sprintf("%s: defined by the layers but missing", k))
	}
	return diffs
}

// compareEntry returns how the entry at p (rel in the tree, lstat st)
// differs from model node n in mode, owner, mtime, content, link target,
// device numbers and extended attributes; its type already matched.
func compareEntry(p, rel string, n *Node, st *unix.Stat_t) []string {
	var diffs []string
	if n.Type != tar.TypeSymlink && int64(st.Mode&0o7777) != n.Mode {
		diffs = append(diffs, fmt.Sprintf("%s: mode %o, want %o", rel, st.Mode&0o7777, n.Mode))
	}
	if int(st.Uid) != n.UID || int(st.Gid) != n.GID {
		diffs = append(diffs, fmt.Sprintf("%s: owner %d:%d, want %d:%d", rel, st.Uid, st.Gid, n.UID, n.GID))
	}
	if !n.ModTime.IsZero() && n.Type != tar.TypeDir && st.Mtim.Sec != n.ModTime.Unix() {
		diffs = append(diffs, fmt.Sprintf("%s: mtime %d, want %d", rel, st.Mtim.Sec, n.ModTime.Unix()))
	}
	switch n.Type {
	case tar.TypeReg:
		b, err := os.ReadFile(p)
		if err != nil || string(b) != n.Data {
			diffs = append(diffs, fmt.Sprintf("%s: content %q (err %v), want %q", rel, trunc(b), err, trunc([]byte(n.Data))))
		}
	case tar.TypeSymlink:
		if l, err := os.Readlink(p); err != nil || l != n.Link {
			diffs = append(diffs, fmt.Sprintf("%s: symlink to %q (err %v), want %q", rel, l, err, n.Link))
		}
	case tar.TypeChar, tar.TypeBlock:
		if int64(unix.Major(st.Rdev)) != n.Major || int64(unix.Minor(st.Rdev)) != n.Minor {
			diffs = append(diffs, fmt.Sprintf("%s: device %d:%d, want %d:%d", rel, unix.Major(st.Rdev), unix.Minor(st.Rdev), n.Major, n.Minor))
		}
	}
	for k, v := range n.Xattrs {
		buf := make([]byte, 4096)
		sz, err := unix.Lgetxattr(p, k, buf)
		if err != nil || string(buf[:sz]) != v {
			diffs = append(diffs, fmt.Sprintf("%s: xattr %s = %q (err %v), want %q", rel, k, buf[:max(sz, 0)], err, v))
		}
	}
	return diffs
}

func trunc(b []byte) string {
	if len(b) > 64 {
		return string(b[:64]) + "..."
	}
	return string(b)
}

// FromTree models an existing directory tree (for trees tarred with GNU tar).
func FromTree(root string) (Model, error) {
	m := Model{}
	links := map[uint64]*Node{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if rel == "." {
			return nil
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFDIR && st.Nlink > 1 {
			if n := links[st.Ino]; n != nil {
				m[rel] = n
				return nil
			}
		}
		n := &Node{Mode: int64(st.Mode & 0o7777), UID: int(st.Uid), GID: int(st.Gid), ModTime: time.Unix(st.Mtim.Sec, 0)}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			n.Type = tar.TypeReg
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			n.Data = string(b)
		case unix.S_IFDIR:
			n.Type = tar.TypeDir
		case unix.S_IFLNK:
			n.Type = tar.TypeSymlink
			if n.Link, err = os.Readlink(p); err != nil {
				return err
			}
		case unix.S_IFCHR, unix.S_IFBLK:
			n.Type = tar.TypeChar
			if st.Mode&unix.S_IFMT == unix.S_IFBLK {
				n.Type = tar.TypeBlock
			}
			n.Major, n.Minor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
		case unix.S_IFIFO:
			n.Type = tar.TypeFifo
		default:
			return nil
		}
		if st.Nlink > 1 && n.Type != tar.TypeDir {
			links[st.Ino] = n
		}
		m[rel] = n
		return nil
	})
	return m, err
}

// Crafted layers exercise whiteouts, opaque directories, hard links, symbolic
// links, setuid bits, ownership, xattrs, device nodes and a file deleted in
// one layer and recreated in the next.
func Crafted() [][]Entry {
	owned := File("srv/owned", "owned by 1234", 0o640)
	owned.UID, owned.GID = 1234, 5678
	capped := File("usr/bin/ping", "ping", 0o755)
	capped.Xattrs = map[string]string{"security.capability": "\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00", "user.note": "hello"}
	xdir := Dir("srv/xdir", 0o750)
	xdir.Xattrs = map[string]string{"trusted.overlay.test": "y"}
	return [][]Entry{
		{
			Dir("./", 0o755),
			Dir("etc", 0o755),
			File("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n", 0o644),
			File("etc/gone", "deleted later", 0o644),
			File("etc/recreated", "first version", 0o644),
			Dir("opaque", 0o755),
			File("opaque/lower1", "lower", 0o644),
			Dir("opaque/sub", 0o700),
			File("opaque/sub/deep", "deep", 0o644),
			Dir("gonedir", 0o755),
			File("gonedir/x", "x", 0o644),
			Dir("usr", 0o755),
			Dir("usr/bin", 0o755),
			File("usr/bin/sudo", "sudo", 0o4755),
			File("usr/bin/wall", "wall", 0o2755),
			Dir("tmp", 0o1777),
			capped,
			Hardlink("usr/bin/sudo-link", "usr/bin/sudo"),
			Symlink("bin", "usr/bin"),
			Symlink("etc/abs-link", "/etc/passwd"),
			Dir("dev", 0o755),
			Char("dev/null", 1, 3),
			Char("dev/zero", 1, 5),
			Fifo("dev/fifo"),
			{Name: "dev/sda", Type: tar.TypeBlock, Mode: 0o660, Major: 8, Minor: 0, GID: 6, ModTime: time.Unix(1700000000, 0)},
			File("implicit/parent/file", "no parent entries", 0o600),
		},
		{
			Whiteout("etc/gone"),
			Whiteout("etc/recreated"),
			Whiteout("gonedir"),
			Whiteout("does/not/exist"),
			Opaque("opaque"),
			File("opaque/upper", "upper", 0o644),
			Dir("srv", 0o755),
			owned,
			xdir,
			File("etc/passwd", "root:x:0:0:root:/root:/bin/bash\n", 0o600),
			Hardlink("srv/passwd-link", "etc/passwd"),
			Symlink("usr/bin/sudo", "/bin/false"), // a file replaced by a symlink
		},
		{
			File("etc/recreated", "second version", 0o600),
			Dir("gonedir", 0o711),
			Dir("opaque/new", 0o755),
			Opaque("opaque/new"), // opaque in the same layer keeps this layer's entries
			File("opaque/new/kept", "kept", 0o644),
		},
	}
}
