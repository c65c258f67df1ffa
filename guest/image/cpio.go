package image

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
)

// cpioEntry is one file of an initramfs.
type cpioEntry struct {
	Name    string // path inside the archive, without leading slash
	Mode    uint32 // permission bits plus one of the cpio type bits below
	Source  string // host file to copy for regular files
	Data    []byte // inline content when Source is empty
	DevMaj  uint32
	DevMin  uint32
	Symlink string
}

const (
	cpioDir     = 0o040000
	cpioFile    = 0o100000
	cpioSymlink = 0o120000
	cpioCharDev = 0o020000
)

// writeCpio writes entries as a "newc" cpio archive, the format the kernel
// unpacks into its initramfs. Parents are emitted before children.
func writeCpio(w io.Writer, entries []cpioEntry) error {
	bw := bufio.NewWriter(w)
	sort.SliceStable(entries, func(i, j int) bool { return entries[i].Name < entries[j].Name })
	ino := uint32(1)
	var off int64
	write := func(e cpioEntry, data []byte, size int64, src io.Reader) error {
		name := e.Name + "\x00"
		hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
			ino, e.Mode, 0, 0, 1, 0, size, 0, 0, e.DevMaj, e.DevMin, len(name), 0)
		ino++
		n, _ := bw.WriteString(hdr)
		m, _ := bw.WriteString(name)
		off += int64(n + m)
		if err := pad(bw, &off); err != nil {
			return err
		}
		if src != nil {
			c, err := io.Copy(bw, src)
			if err != nil {
				return fmt.Errorf("cpio: copy %s: %w", e.Name, err)
			}
			if c != size {
				return fmt.Errorf("cpio: %s changed size while archiving", e.Name)
			}
		} else {
			_, _ = bw.Write(data)
		}
		off += size
		return pad(bw, &off)
	}
	for _, e := range entries {
		e.Name = path.Clean(e.Name)
		switch {
		case e.Mode&cpioSymlink == cpioSymlink:
			if err := write(e, []byte(e.Symlink), int64(len(e.Symlink)), nil); err != nil {
				return err
			}
		case e.Mode&cpioFile == cpioFile && e.Source != "":
			if err := writeCpioFile(e, write); err != nil {
				return err
			}
		default:
			if err := write(e, e.Data, int64(len(e.Data)), nil); err != nil {
				return err
			}
		}
	}
	if err := write(cpioEntry{Name: "TRAILER!!!"}, nil, 0, nil); err != nil {
		return err
	}
	return bw.Flush()
}

func writeCpioFile(e cpioEntry, write func(cpioEntry, []byte, int64, io.Reader) error) error {
	f, err := os.Open(e.Source)
	if err != nil {
		return fmt.Errorf("cpio: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("cpio: %w", err)
	}
	return write(e, nil, st.Size(), f)
}

func pad(w *bufio.Writer, off *int64) error {
	for *off%4 != 0 {
		if err := w.WriteByte(0); err != nil {
			return err
		}
		*off++
	}
	return nil
}
