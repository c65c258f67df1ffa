package memsnap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/agentenv/agentenv/storage/lsmt"
)

// ImportFull writes a memory file (the shared RAM file of a freshly booted VM)
// as a sealed base layer at out: non-zero pages only (holes and zero pages
// stay unmapped, there is no parent). The virtual size is the file size
// rounded up to a sector. The layer is written atomically (internal/atomicfile).
func ImportFull(ctx context.Context, memFile, out, message string) (Stats, error) {
	start := time.Now()
	st, err := importFull(ctx, memFile, out, message)
	if err != nil {
		return st, fmt.Errorf("import memory %s into %s: %w", memFile, out, err)
	}
	st.Took = time.Since(start)
	slog.Debug("memsnap: imported memory file", "file", memFile, "out", out, "pages", st.Pages, "bytes", st.Bytes, "took", st.Took)
	return st, nil
}

func importFull(ctx context.Context, memFile, out, message string) (Stats, error) {
	return importFile(ctx, memFile, out, lsmt.SealOptions{Message: message}, writeNonZeroPages)
}

// pageWriter writes the pages of b (at logical offset off) into xw.
type pageWriter func(xw *lsmt.ExtentWriter, b []byte, off int64, st *Stats) error

// importFile seals the data extents of memFile as a layer at out (opt gives
// parent and message; the virtual size is the file's), each chunk of data
// handed to write.
func importFile(ctx context.Context, memFile, out string, opt lsmt.SealOptions, write pageWriter) (Stats, error) {
	var st Stats
	f, err := os.Open(memFile)
	if err != nil {
		return st, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return st, err
	}
	if fi.Size() == 0 {
		return st, errors.New("empty file")
	}
	vs := (fi.Size() + lsmt.SectorSize - 1) / lsmt.SectorSize * lsmt.SectorSize
	opt.VirtualSize = uint64(vs)
	err = writeLayer(out, opt, &st, func(xw *lsmt.ExtentWriter) error {
		return importExtents(ctx, f, fi.Size(), vs, xw, &st, write)
	})
	return st, err
}

// importExtents hands the pages of f's data extents (SEEK_DATA / SEEK_HOLE;
// the whole file where holes are not reported) to write.
func importExtents(ctx context.Context, f *os.File, size, vs int64, xw *lsmt.ExtentWriter, st *Stats, write pageWriter) error {
	buf := make([]byte, readBatch)
	ps := int64(pageSize)
	next := int64(0) // everything before this is done
	for next < vs {
		if err := ctx.Err(); err != nil {
			return err
		}
		data, hole, err := dataExtent(f, next, size)
		if err != nil {
			return err
		}
		if data >= size {
			return nil
		}
		// Whole pages, so zero detection and the layer's extents stay page-granular.
		pos := max(data/ps*ps, next)
		end := min((hole+ps-1)/ps*ps, vs)
		for pos < end {
			chunk := buf[:min(int64(len(buf)), end-pos)]
			if err := readPadded(f, chunk, pos); err != nil {
				return err
			}
			if err := write(xw, chunk, pos, st); err != nil {
				return err
			}
			pos += int64(len(chunk))
		}
		next = end
	}
	return nil
}

// dataExtent returns the next data extent [data, hole) at or after off; data
// is size or more when only a hole remains.
func dataExtent(f *os.File, off, size int64) (int64, int64, error) {
	fd := int(f.Fd())
	data, err := unix.Seek(fd, off, unix.SEEK_DATA)
	switch {
	case errors.Is(err, unix.ENXIO):
		return size, size, nil
	case errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP):
		return off, size, nil // no hole reporting: all data
	case err != nil:
		return 0, 0, fmt.Errorf("seek data at %d: %w", off, err)
	}
	hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
	if err != nil {
		return 0, 0, fmt.Errorf("seek hole at %d: %w", data, err)
	}
	return data, min(hole, size), nil
}

// readPadded reads len(p) bytes at off, zeros past the end of the file.
func readPadded(f *os.File, p []byte, off int64) error {
	n, err := f.ReadAt(p, off)
	if n == len(p) {
		return nil
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read at %d: %w", off, err)
	}
	clear(p[n:])
	return nil
}

// writeNonZeroPages writes the runs of non-zero pages of b (at logical offset
// off) as data; zero pages are left unmapped. The last page may be short.
func writeNonZeroPages(xw *lsmt.ExtentWriter, b []byte, off int64, st *Stats) error {
	pageAt := func(i int) []byte { return b[i:min(i+pageSize, len(b))] }
	for i := 0; i < len(b); {
		if isZero(pageAt(i)) {
			i += pageSize
			continue
		}
		j := i + pageSize
		for j < len(b) && !isZero(pageAt(j)) {
			j += pageSize
		}
		j = min(j, len(b))
		if err := xw.WriteData(off+int64(i), b[i:j]); err != nil {
			return err
		}
		st.Pages += int64((j - i + pageSize - 1) / pageSize)
		i = j
	}
	return nil
}
