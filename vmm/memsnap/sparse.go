package memsnap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/agentenv/agentenv/storage/lsmt"
)

// ImportSparseDiff writes a VMM's own diff snapshot memory file as a sealed
// layer at out whose parent is parentUUID. Firecracker's Diff snapshots are
// such files: the size of guest RAM, with data extents exactly where the
// guest dirtied pages and holes elsewhere. Every page of a data extent is a
// written page, so an all-zero one becomes a zeroed extent (it must hide the
// parent's data); holes stay unmapped (the parent shows through). A file
// system that reports no holes makes every page a written one: correct, only
// larger. The layer is written to out+".tmp" and renamed.
func ImportSparseDiff(ctx context.Context, diffFile, out string, parentUUID lsmt.UUID, message string) (Stats, error) {
	start := time.Now()
	st, err := importSparseDiff(ctx, diffFile, out, parentUUID, message)
	if err != nil {
		return st, fmt.Errorf("import diff snapshot %s into %s: %w", diffFile, out, err)
	}
	st.Took = time.Since(start)
	slog.Debug("memsnap: imported diff snapshot", "file", diffFile, "out", out, "pages", st.Pages,
		"zero_pages", st.ZeroPages, "took", st.Took)
	return st, nil
}

func importSparseDiff(ctx context.Context, diffFile, out string, parent lsmt.UUID, message string) (Stats, error) {
	var st Stats
	f, err := os.Open(diffFile)
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
	size := fi.Size()
	vs := (size + lsmt.SectorSize - 1) / lsmt.SectorSize * lsmt.SectorSize
	af, err := createAtomic(out)
	if err != nil {
		return st, err
	}
	xw, err := lsmt.NewExtentWriter(af, lsmt.SealOptions{VirtualSize: uint64(vs), Parent: parent, Message: message})
	if err != nil {
		af.abort()
		return st, err
	}
	if err := copyDataExtents(ctx, f, size, vs, xw, &st); err != nil {
		af.abort()
		return st, err
	}
	res, err := xw.Close()
	if err != nil {
		af.abort()
		return st, err
	}
	if err := af.commit(); err != nil {
		return st, err
	}
	st.Bytes = res.FileSize
	return st, nil
}

// copyDataExtents writes every page of f's data extents into xw: zero pages
// as zeroed extents, the rest as data.
func copyDataExtents(ctx context.Context, f *os.File, size, vs int64, xw *lsmt.ExtentWriter, st *Stats) error {
	buf := make([]byte, readBatch)
	ps := int64(pageSize)
	for next := int64(0); next < vs; {
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
		pos := max(data/ps*ps, next)
		end := min((hole+ps-1)/ps*ps, vs)
		for pos < end {
			chunk := buf[:min(int64(len(buf)), end-pos)]
			if err := readPadded(f, chunk, pos); err != nil {
				return err
			}
			if err := writeWrittenPages(xw, chunk, pos, st); err != nil {
				return err
			}
			pos += int64(len(chunk))
		}
		next = end
	}
	return nil
}

// writeWrittenPages writes b (at logical offset off) page by page runs:
// runs of zero pages as zeroed extents, runs of others as data.
func writeWrittenPages(xw *lsmt.ExtentWriter, b []byte, off int64, st *Stats) error {
	pageAt := func(i int) []byte { return b[i:min(i+pageSize, len(b))] }
	for i := 0; i < len(b); {
		zero := isZero(pageAt(i))
		j := i + pageSize
		for j < len(b) && isZero(pageAt(j)) == zero {
			j += pageSize
		}
		j = min(j, len(b))
		pages := int64((j - i + pageSize - 1) / pageSize)
		if zero {
			if err := xw.WriteZeroed(off+int64(i), int64(j-i)); err != nil {
				return err
			}
			st.ZeroPages += pages
		} else {
			if err := xw.WriteData(off+int64(i), b[i:j]); err != nil {
				return err
			}
			st.Pages += pages
		}
		i = j
	}
	return nil
}
