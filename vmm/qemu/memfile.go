package qemu

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

const pageSize = 4096

// sparseCopy copies src to dst leaving holes wherever src has holes or
// all-zero pages, so a memory image costs disk only for the pages in use.
// It returns the bytes of data written.
func sparseCopy(src, dst string) (int64, error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, fmt.Errorf("copy memory %s: %w", src, err)
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return 0, fmt.Errorf("copy memory %s: %w", src, err)
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return 0, fmt.Errorf("copy memory to %s: %w", dst, err)
	}
	written, err := copyExtents(in, out, st.Size())
	if err == nil {
		err = out.Truncate(st.Size())
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(dst)
		return 0, fmt.Errorf("copy memory %s to %s: %w", src, dst, err)
	}
	return written, nil
}

func copyExtents(in, out *os.File, size int64) (int64, error) {
	buf := make([]byte, 1<<20)
	var written int64
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole remains
		}
		if err != nil {
			return written, fmt.Errorf("seek data: %w", err)
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return written, fmt.Errorf("seek hole: %w", err)
		}
		for pos := data; pos < hole; {
			n := min(int64(len(buf)), hole-pos)
			if _, err := in.ReadAt(buf[:n], pos); err != nil && !errors.Is(err, io.EOF) {
				return written, err
			}
			w, err := writeNonZeroPages(out, buf[:n], pos)
			written += w
			if err != nil {
				return written, err
			}
			pos += n
		}
		off = hole
	}
	return written, nil
}

// writeNonZeroPages writes the runs of non-zero pages of b (which sits at off).
func writeNonZeroPages(out *os.File, b []byte, off int64) (int64, error) {
	var written int64
	start := -1
	flush := func(end int) error {
		if start < 0 {
			return nil
		}
		n, err := out.WriteAt(b[start:end], off+int64(start))
		written += int64(n)
		start = -1
		return err
	}
	for p := 0; p < len(b); p += pageSize {
		end := min(p+pageSize, len(b))
		if isZero(b[p:end]) {
			if err := flush(p); err != nil {
				return written, err
			}
			continue
		}
		if start < 0 {
			start = p
		}
	}
	return written, flush(len(b))
}

var zeroPage [pageSize]byte

func isZero(b []byte) bool { return bytes.Equal(b, zeroPage[:len(b)]) }

// linkOrCopy hard-links src to dst when they share a filesystem, else copies sparsely.
func linkOrCopy(src, dst string) error {
	_ = os.Remove(dst)
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	_, err := sparseCopy(src, dst)
	return err
}
