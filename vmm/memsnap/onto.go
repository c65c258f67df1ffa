package memsnap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/agentenv/agentenv/internal/atomicfile"

	"golang.org/x/sys/unix"
)

// MaterializeOnto is Materialize for a stack whose lower part is flattened
// already: base is the file that the layers were captured against (the
// materialized lower layers, or the memory file of the base layer), and
// layers are the layers above it, bottom to top. out gets base's contents
// (a reflink clone where the filesystem can, else an in-kernel copy of its
// data extents, holes kept) with the layers applied: data pages written,
// zeroed extents and zero pages punched out. On filesystems that clone
// (XFS, btrfs) the cost is the size of the diffs alone; elsewhere (ext4,
// tmpfs) it is a full copy of base plus the diffs, which bench/memsnap
// measures as slower than Materialize of a base and one diff: use it there
// only for deep stacks. The size is the top
// layer's virtual size. Like Materialize, it writes it atomically (internal/atomicfile)
// it; out may be base itself. It equals Materialize of the whole stack when
// base is as large as the lower layers (one chain has one size).
func MaterializeOnto(ctx context.Context, base string, layers []string, out string) error {
	start := time.Now()
	n, err := materializeOnto(ctx, base, layers, out)
	if err != nil {
		return fmt.Errorf("materialize %d memory layers onto %s into %s: %w", len(layers), base, out, err)
	}
	slog.Debug("memsnap: materialized memory layers onto a base file", "base", base, "layers", len(layers), "out", out,
		"data_bytes", n, "took", time.Since(start))
	return nil
}

func materializeOnto(ctx context.Context, base string, paths []string, out string) (int64, error) {
	st, err := openStack(paths)
	if err != nil {
		return 0, err
	}
	defer st.Close()
	src, err := os.Open(base)
	if err != nil {
		return 0, err
	}
	defer src.Close()
	fi, err := src.Stat()
	if err != nil {
		return 0, err
	}
	if !fi.Mode().IsRegular() {
		return 0, fmt.Errorf("base %s is not a regular file", base)
	}
	af, err := atomicfile.Create(out, 0o600) // guest memory: private to its owner
	if err != nil {
		return 0, err
	}
	err = cloneSparse(ctx, src, af.File, fi.Size())
	if err == nil {
		err = af.Truncate(st.Size())
	}
	var written int64
	if err == nil {
		written, err = copyStack(ctx, st, af, true)
	}
	if err != nil {
		af.Abort()
		return written, err
	}
	return written, af.Commit()
}

// cloneSparse makes dst (empty) a copy of src's first size bytes: a reflink
// clone when the filesystem supports one, else each data extent copied with
// copy_file_range (holes stay holes).
func cloneSparse(ctx context.Context, src, dst *os.File, size int64) error {
	if err := unix.IoctlFileClone(int(dst.Fd()), int(src.Fd())); err == nil {
		return nil
	}
	for off := int64(0); off < size; {
		if err := ctx.Err(); err != nil {
			return err
		}
		data, hole, err := dataExtent(src, off, size)
		if err != nil {
			return err
		}
		if data >= size {
			break
		}
		if err := copyRange(src, dst, data, hole-data); err != nil {
			return fmt.Errorf("copy base [%d,%d): %w", data, hole, err)
		}
		off = hole
	}
	return dst.Truncate(size)
}

// copyRange copies n bytes at off from src to dst (same offset), in the
// kernel where it can.
func copyRange(src, dst *os.File, off, n int64) error {
	for n > 0 {
		roff, woff := off, off
		c, err := unix.CopyFileRange(int(src.Fd()), &roff, int(dst.Fd()), &woff, int(min(n, 1<<30)), 0)
		if err != nil || c == 0 {
			if err == nil || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EINVAL) ||
				errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EOPNOTSUPP) {
				return copyRangeUser(src, dst, off, n)
			}
			return err
		}
		off, n = off+int64(c), n-int64(c)
	}
	return nil
}

// copyRangeUser is copyRange through a user buffer.
func copyRangeUser(src, dst *os.File, off, n int64) error {
	_, err := io.Copy(io.NewOffsetWriter(dst, off), io.NewSectionReader(src, off, n))
	return err
}

// zeroRange makes [off, off+n) of f read as zeros: holes punched for the
// whole pages, zeros written at unaligned edges (or everywhere when the
// filesystem cannot punch).
func zeroRange(f *os.File, off, n int64) error {
	ps := int64(pageSize)
	a := (off + ps - 1) / ps * ps
	b := (off + n) / ps * ps
	if a < b {
		err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, a, b-a)
		if err == nil {
			if err := writeZeros(f, off, a-off); err != nil {
				return err
			}
			return writeZeros(f, b, off+n-b)
		}
		if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.ENOSYS) {
			return fmt.Errorf("punch hole [%d,%d): %w", a, b, err)
		}
	}
	return writeZeros(f, off, n)
}

func writeZeros(f *os.File, off, n int64) error {
	for n > 0 {
		k := min(n, int64(len(zeroPage)))
		if _, err := f.WriteAt(zeroPage[:k], off); err != nil {
			return fmt.Errorf("write zeros at %d: %w", off, err)
		}
		off, n = off+k, n-k
	}
	return nil
}
