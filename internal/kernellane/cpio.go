package kernellane

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"
)

// entry is one member of the initramfs archive.
type entry struct {
	name    string // without leading slash
	mode    uint32 // permission bits with a type bit below
	source  string // host file, for regular files without data
	data    []byte
	symlink string
}

const (
	typeDir     = 0o040000
	typeFile    = 0o100000
	typeSymlink = 0o120000
)

// writeCpio writes entries in the "newc" cpio format the kernel unpacks as
// its initramfs: a 110-byte ASCII header per member, name and data each
// padded to four bytes, closed by a TRAILER!!! member. Every parent
// directory is emitted before its children.
func writeCpio(w io.Writer, entries []entry) error {
	entries = append([]entry(nil), entries...)
	for i := range entries {
		entries[i].name = strings.TrimPrefix(path.Clean("/"+entries[i].name), "/")
	}
	entries = withParents(entries)
	sort.SliceStable(entries, func(i, j int) bool { return entries[i].name < entries[j].name })
	cw := &cpioWriter{w: bufio.NewWriterSize(w, 1<<20), ino: 1}
	for _, e := range entries {
		if err := cw.add(e); err != nil {
			return err
		}
	}
	if err := cw.member(entry{name: "TRAILER!!!"}, 0, nil); err != nil {
		return err
	}
	return cw.w.Flush()
}

// withParents adds the directories the entries' paths need.
func withParents(entries []entry) []entry {
	have := map[string]bool{}
	for _, e := range entries {
		have[e.name] = true
	}
	out := entries
	for _, e := range entries {
		for d := path.Dir(e.name); d != "." && d != "/" && !have[d]; d = path.Dir(d) {
			have[d] = true
			out = append(out, entry{name: d, mode: typeDir | 0o755})
		}
	}
	return out
}

type cpioWriter struct {
	w   *bufio.Writer
	off int64
	ino uint32
}

func (c *cpioWriter) add(e entry) error {
	switch {
	case e.mode&typeSymlink == typeSymlink:
		return c.member(e, int64(len(e.symlink)), strings.NewReader(e.symlink))
	case e.mode&typeFile == typeFile && e.source != "":
		f, err := os.Open(e.source)
		if err != nil {
			return fmt.Errorf("cpio: %w", err)
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return fmt.Errorf("cpio: %w", err)
		}
		return c.member(e, st.Size(), f)
	default:
		return c.member(e, int64(len(e.data)), strings.NewReader(string(e.data)))
	}
}

func (c *cpioWriter) member(e entry, size int64, data io.Reader) error {
	if size > 0xffffffff {
		return fmt.Errorf("cpio: %s: %d bytes is more than newc holds", e.name, size)
	}
	name := e.name + "\x00"
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, e.mode, 0, 0, 1, 0, size, 0, 0, 0, 0, len(name), 0)
	c.ino++
	c.write(hdr + name)
	c.pad()
	if data != nil {
		n, err := io.Copy(c.w, data)
		if err != nil {
			return fmt.Errorf("cpio: copy %s: %w", e.name, err)
		}
		if n != size {
			return fmt.Errorf("cpio: %s changed size while archiving", e.name)
		}
		c.off += n
	}
	c.pad()
	return nil
}

func (c *cpioWriter) write(s string) {
	n, _ := c.w.WriteString(s) // a bufio error sticks and is returned by Flush
	c.off += int64(n)
}

func (c *cpioWriter) pad() {
	if r := c.off % 4; r != 0 {
		c.write(strings.Repeat("\x00", int(4-r)))
	}
}
